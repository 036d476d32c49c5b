"""Candidate TP × PP × EP plans: per-device memory of each, the rules a plan must satisfy, and the choice.

Everything per layer is precomputed once per model (``Model.build``), so evaluating a plan costs O(pp) and a
3-trillion-parameter config with hundreds of candidates plans in milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from agents.runtime.params import LayerParams, ParamCount
from agents.runtime.planner.memory import DTYPES, PlanSettings, activation_bytes, kv_layer_bytes, layer_bits
from agents.runtime.spec import ModelSpec


@dataclass(frozen=True)
class LayerBytes:
    """One layer kind's weight bytes by sharding rule."""

    tp_sharded: float  # attention projections, dense MLP, shared experts
    replicated: float  # MLA down-projections, norms, biases, router
    stage_sharded: float  # routed experts: split over all devices of a pipeline stage

    @classmethod
    def of(cls, layer: LayerParams, dtype: str, keep_attention: bool) -> LayerBytes:
        sharded, replicated, experts = layer_bits(layer, dtype, keep_attention)
        return cls(sharded / 8, replicated / 8, experts / 8)

    def per_device(self, tp: int, stage: int) -> float:
        return self.tp_sharded / tp + self.replicated + self.stage_sharded / stage


@dataclass(frozen=True)
class Model:
    """What the search needs of one model at one dtype."""

    spec: ModelSpec
    settings: PlanSettings
    kinds: tuple[LayerBytes, ...]  # index: 2 × is_moe + is_sliding
    prefix: tuple[tuple[int, ...], ...]  # prefix[k][i]: layers of kind k among the first i
    embed_bytes: float
    head_bytes: float
    act_bytes: int
    has_dense: bool  # some layer has a dense MLP (``spec.dense_layers`` is O(layers): computed once here)

    @classmethod
    def build(cls, spec: ModelSpec, counts: ParamCount, dtype: str, settings: PlanSettings,
              keep_attention: bool = False) -> Model:
        moe = set(spec.moe_layers)
        types = spec.layer_types or (("sliding_attention",) * spec.num_layers if spec.sliding_window else ())
        sliding = {i for i, kind in enumerate(types) if kind == "sliding_attention"}
        kind_of = [2 * (i in moe) + (i in sliding) for i in range(spec.num_layers)]
        kinds = [LayerBytes(0, 0, 0)] * 4
        for i, kind in enumerate(kind_of):
            kinds[kind] = LayerBytes.of(counts.layers[i], dtype, keep_attention)
        prefix = []
        for kind in range(4):
            running, acc = [0], 0
            for k in kind_of:
                acc += k == kind
                running.append(acc)
            prefix.append(tuple(running))
        rest = DTYPES[dtype][1] / 8
        return cls(spec, settings, tuple(kinds), tuple(prefix), counts.embedding * rest,
                   (counts.lm_head + counts.final_norm) * rest, activation_bytes(dtype),
                   has_dense=len(moe) < spec.num_layers)


@dataclass(frozen=True)
class Devices:
    memory_bytes: int
    devices_per_node: int
    shared_memory: bool = False


@dataclass
class Plan:
    """One evaluated candidate."""

    tp: int
    pp: int
    ep: int
    devices: int
    nodes: int
    memory_per_device: int
    fits: bool = False
    bytes_per_device: int = 0
    usable_per_device: int = 0
    kv_tokens: int = 0
    max_context: int = 0
    max_batch: int = 0
    breakdown: dict[str, int] = field(default_factory=dict)
    context_batch: list[dict[str, int]] = field(default_factory=list)

    @property
    def shortfall_bytes(self) -> int:
        return max(0, self.bytes_per_device - self.usable_per_device)

    def shortfall_message(self) -> str:
        gib = 1 << 30
        return (f"does not fit: the best plan (tp={self.tp}, pp={self.pp}, ep={self.ep}, {self.devices} devices) "
                f"needs {self.bytes_per_device / gib:.2f} GiB per device but {self.usable_per_device / gib:.2f} GiB "
                f"are usable ({self.memory_per_device / gib:.2f} GiB less headroom): short by "
                f"{self.shortfall_bytes / gib:.2f} GiB per device")

    def to_dict(self, top_level: bool = False) -> dict[str, Any]:
        plan = {"tp": self.tp, "pp": self.pp, "ep": self.ep, "devices": self.devices, "nodes": self.nodes}
        out = {"fits": self.fits, "bytes_per_device": self.bytes_per_device,
               "memory_per_device": self.memory_per_device, "usable_per_device": self.usable_per_device,
               "kv_tokens": self.kv_tokens, "max_context": self.max_context, "max_batch": self.max_batch}
        if top_level:
            return {"plan": plan, **out, "breakdown": dict(self.breakdown), "shortfall_bytes": self.shortfall_bytes,
                    "context_batch": list(self.context_batch)}
        return {**plan, **out}


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _tp_ok(model: Model, tp: int) -> bool:
    spec = model.spec
    if spec.num_attention_heads % tp:
        return False
    if not spec.is_mla and spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        return False
    return not (model.has_dense and spec.intermediate_size % tp)


def _stage_ok(spec: ModelSpec, tp: int, ep: int) -> bool:
    stage = max(tp, ep)
    if stage % tp or stage % ep:
        return False
    if not spec.is_moe:
        return ep == 1
    if spec.num_experts % ep:
        return False
    return spec.moe_intermediate_size % (stage // ep) == 0  # each expert split over stage/ep devices


def evaluate(model: Model, hw: Devices, tp: int, pp: int, ep: int) -> Plan:
    """Per-device memory of one plan; the heaviest pipeline stage decides."""
    spec, s = model.spec, model.settings
    stage = max(tp, ep)
    devices = pp * stage
    if hw.shared_memory:
        nodes, memory = 1, hw.memory_bytes // devices
    else:
        nodes, memory = math.ceil(devices / hw.devices_per_node), hw.memory_bytes
    usable = int(memory * (1 - s.headroom))
    h, act = spec.hidden_size, model.act_bytes
    tokens = min(s.prefill_tokens, spec.context_length)
    if spec.is_mla:
        kv_per_layer = kv_layer_bytes(spec, act)  # the latent is replicated on every tp rank
        qkv = spec.num_attention_heads * (spec.qk_head_dim + spec.qk_nope_head_dim + 2 * spec.v_head_dim)
    else:
        kv_per_layer = 2 * math.ceil(spec.num_kv_heads / tp) * spec.head_dim * act
        qkv = (2 * spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
    ffn = spec.intermediate_size if model.has_dense else 0
    if spec.is_moe:
        ffn = max(ffn, spec.num_experts_per_tok * spec.moe_intermediate_size
                  + spec.num_shared_experts * spec.moe_intermediate_size)
    activations = act * tokens * (4 * h + (qkv + 3 * ffn) / tp) + s.max_seqs * spec.vocab_size / tp * 4
    comm = 0
    if tp > 1:
        comm += 2 * tokens * h * act
    if ep > 1:
        comm += 2 * tokens * spec.num_experts_per_tok * h * act
    if pp > 1:
        comm += 2 * tokens * h * act
    overhead = min(s.overhead_bytes, memory // 20)
    window = min(spec.sliding_window or 0, spec.context_length)
    min_context = min(s.min_context, spec.context_length)

    worst: tuple[float, float, float, float] | None = None  # (required, weights, kv/token, kv/sequence)
    start = 0
    for i in range(pp):
        end = start + spec.num_layers // pp + (1 if i < spec.num_layers % pp else 0)
        counts = [model.prefix[k][end] - model.prefix[k][start] for k in range(4)]
        weights = sum(c * model.kinds[k].per_device(tp, stage) for k, c in enumerate(counts) if c)
        weights += (model.embed_bytes / tp if i == 0 else 0) + (model.head_bytes / tp if i == pp - 1 else 0)
        kv_tok = (counts[0] + counts[2]) * kv_per_layer
        kv_seq = (counts[1] + counts[3]) * kv_per_layer * window
        required = weights + activations + comm + overhead + kv_tok * min_context + kv_seq
        if worst is None or required > worst[0]:
            worst = (required, weights, kv_tok, kv_seq)
        start = end
    assert worst is not None
    required, weights, kv_tok, kv_seq = worst
    static = weights + activations + comm + overhead
    plan = Plan(tp, pp, ep, devices, nodes, int(memory), usable_per_device=usable, bytes_per_device=int(required))
    plan.breakdown = {"weights": int(weights), "activations": int(activations), "comm_buffers": int(comm),
                      "overhead": int(overhead), "kv_min_context": int(kv_tok * min_context + kv_seq),
                      "kv_pool": int(max(0, usable - static))}
    plan.fits = required <= usable
    if plan.fits:
        pool, replicas = usable - static, stage // tp
        longest = int((pool - kv_seq) // kv_tok) if kv_tok else spec.context_length
        plan.max_context = min(spec.context_length, longest)

        def batch(length: int) -> int:  # sequences of ``length`` tokens the pools hold, engine cap included
            cost = kv_tok * length + kv_seq * min(length, window) / max(window, 1)
            return min(int(pool // cost) if cost else s.max_seqs, s.max_seqs) * replicas

        plan.max_batch = batch(plan.max_context)
        lengths = sorted({n for n in (4096, 32768, 131072) if n < plan.max_context} | {plan.max_context})
        plan.context_batch = [{"context": n, "batch": batch(n)} for n in lengths]
        plan.kv_tokens = (int(pool // kv_tok) if kv_tok else plan.max_context * plan.max_batch) * replicas
    return plan


def search(model: Model, hw: Devices, fixed: dict[str, int | None]) -> list[Plan]:
    """Every plan allowed by the rules (module docstring of ``planner``), within max_nodes; pinned degrees in
    ``fixed`` skip the devices-per-node limit but not the divisibility rules."""
    spec = model.spec
    max_devices = hw.devices_per_node * model.settings.max_nodes
    if fixed.get("tp"):
        tps = [fixed["tp"]] if _tp_ok(model, fixed["tp"]) else []
    else:
        # a tensor-parallel group never straddles two nodes
        tps = [t for t in _divisors(spec.num_attention_heads, hw.devices_per_node)
               if _tp_ok(model, t) and (hw.shared_memory or hw.devices_per_node % t == 0)]
    if fixed.get("ep"):
        eps = [fixed["ep"]]
    else:
        eps = _divisors(spec.num_experts, max_devices) if spec.is_moe else [1]
    if fixed.get("pp"):
        pps = [fixed["pp"]] if fixed["pp"] <= spec.num_layers else []
    else:
        powers = {1 << k for k in range(max_devices.bit_length()) if 1 << k <= spec.num_layers}
        pps = sorted(set(_divisors(spec.num_layers, max_devices)) | powers)
    pinned = any(fixed.values())
    plans = []
    for tp in tps:
        for ep in eps:
            if not _stage_ok(spec, tp, ep):
                continue
            for pp in pps:
                devices = pp * max(tp, ep)
                if devices > max_devices and not pinned:
                    continue
                plans.append(evaluate(model, hw, tp, pp, ep))
    return plans


def _rank(plan: Plan) -> tuple:
    return (plan.devices, plan.pp, -plan.kv_tokens, -plan.tp)


def choose(plans: list[Plan]) -> Plan | None:
    """The smallest plan that fits (fewest devices, then fewest stages, then most KV tokens); when none fits, the
    one closest to fitting (smallest shortfall as a share of usable memory)."""
    fitting = [p for p in plans if p.fits]
    if fitting:
        return min(fitting, key=_rank)
    if not plans:
        return None
    return min(plans, key=lambda p: (p.bytes_per_device / max(p.usable_per_device, 1), p.devices))


def summary(plans: list[Plan], chosen: Plan | None, before: int = 12, after: int = 8) -> list[Plan]:
    """The best candidate for each device count, fewest devices first: up to ``before`` counts below the chosen
    plan's, the chosen one, and up to ``after`` above it."""
    best: dict[int, Plan] = {}
    for plan in plans:
        current = best.get(plan.devices)
        key = (not plan.fits, *_rank(plan), plan.bytes_per_device)
        if current is None or key < (not current.fits, *_rank(current), current.bytes_per_device):
            best[plan.devices] = plan
    counts = sorted(best)
    if chosen is not None and chosen.devices in best:
        best[chosen.devices] = chosen
        at = counts.index(chosen.devices)
        counts = counts[max(0, at - before): at + after + 1]
    return [best[d] for d in counts]
