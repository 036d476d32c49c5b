"""Candidate TP × PP × EP plans: per-device memory of each, the rules a plan must satisfy, and the choice.

Everything per layer is precomputed once per model (``Model.build``), so evaluating a plan costs O(pp) and a
3-trillion-parameter config with hundreds of candidates plans in milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from contract.model.params import LayerParams, ParamCount
from contract.model.spec import ModelSpec
from contract.planner.memory import PlanSettings, activation_bytes, kv_layer_bytes, layer_bits, rest_bits


@dataclass(frozen=True)
class LayerBytes:
    """One layer kind's weight bytes by sharding rule."""

    tp_sharded: float  # attention projections, dense MLP, shared experts
    replicated: float  # MLA down-projections, norms, biases, router
    stage_sharded: float  # routed experts: split over all devices of a pipeline stage

    @classmethod
    def of(cls, layer: LayerParams, dtype: str, keep_attention: bool | str) -> LayerBytes:
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
    vision_bytes: float = 0.0  # a vision tower and projector: whole on every device of the first stage
    single_device: str | None = None  # why only tp = pp = ep = 1 runs (the transformers fallback), or None

    @classmethod
    def build(cls, spec: ModelSpec, counts: ParamCount, dtype: str, settings: PlanSettings,
              keep_attention: bool | str = False, single_device: str | None = None) -> Model:
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
        rest = rest_bits(dtype) / 8
        return cls(spec, settings, tuple(kinds), tuple(prefix), counts.embedding * rest,
                   (counts.lm_head + counts.final_norm) * rest, activation_bytes(dtype),
                   has_dense=len(moe) < spec.num_layers, vision_bytes=counts.vision * rest,
                   single_device=single_device)


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


def layout_problem(spec: ModelSpec, hw: Any, tp: int, pp: int, ep: int, has_dense: bool | None = None,
                   single_device: str | None = None) -> str | None:
    """The first deployment rule a TP × PP × EP layout breaks on ``hw`` (anything with ``devices_per_node`` and
    ``shared_memory``), or None. A stage is ``max(tp, ep)`` devices; devices are ``pp × stage``. Ranks that share
    one host's memory (CPU processes) have no node boundary to respect. ``has_dense``: whether some layer has a
    dense MLP (computed from ``spec`` when not given). ``single_device``: why the runtime runs this model on one
    device only (``models/native.single_device_reason``: the transformers fallback), which then is the only
    layout."""
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name}={value!r} must be a positive integer"
    if single_device:
        for name, value in (("tp", tp), ("pp", pp), ("ep", ep)):
            if value > 1:
                return f"{name}={value} cannot run: {single_device}"
    if spec.num_attention_heads % tp:
        return f"tp={tp} must divide the {spec.num_attention_heads} attention heads"
    if not spec.is_mla and spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        return (f"tp={tp} must divide the {spec.num_kv_heads} KV heads or be a multiple of them (KV heads are "
                f"replicated when fewer than tp)")
    dense = bool(spec.dense_layers) if has_dense is None else has_dense
    if dense and spec.intermediate_size % tp:
        return f"tp={tp} must divide the MLP intermediate size {spec.intermediate_size}"
    if pp > spec.num_layers:
        return f"pp={pp} is more pipeline stages than the {spec.num_layers} layers"
    stage = max(tp, ep)
    if not spec.is_moe and ep > 1:
        return f"ep={ep} needs routed experts; this model has none"
    if spec.is_moe:
        if spec.num_experts % ep:
            return f"ep={ep} must divide the {spec.num_experts} routed experts"
        if stage % tp or stage % ep:
            return f"tp={tp} and ep={ep} must divide one another (a stage is max(tp, ep) = {stage} devices)"
        if spec.moe_intermediate_size % (stage // ep):
            return (f"the expert intermediate size {spec.moe_intermediate_size} must split over the "
                    f"{stage // ep} devices that share each expert")
    if getattr(hw, "shared_memory", False):
        return None
    node = hw.devices_per_node
    if tp > node or node % tp:
        return f"tp={tp} must stay inside a node: it must divide the {node} devices per node"
    if pp > 1 and stage % node:
        return (f"pp={pp} spans nodes: each pipeline stage must be whole nodes, but a stage of max(tp, ep) = "
                f"{stage} devices is not a multiple of the {node} devices per node")
    devices = pp * stage
    if devices > node and devices % node:
        return f"a plan over several nodes uses whole nodes: {devices} devices is not a multiple of {node}"
    if devices < node and node % devices:
        return f"{devices} devices must divide the {node} devices of a node (a node splits into equal replicas)"
    return None


class LayoutError(ValueError):
    """A pinned layout no deployment rule allows; ``field`` is the degree (tp, pp or ep) the rule names."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_layout(spec: ModelSpec, hardware: Any, tp: int | None = None, pp: int | None = None,
                 ep: int | None = None, max_nodes: int = 16, single_device: str | None = None) -> None:
    """Raise ``LayoutError`` (a ValueError) naming the rule pinned degrees break: TP divides the heads and stays
    in a node, PP spans whole nodes, EP divides the experts, several nodes are whole nodes; a model only the
    transformers fallback runs (``single_device``: why) runs on one device. A degree left None is free: the pins
    pass when some value of the free ones satisfies every rule (the planner then picks it)."""
    pinned = {"tp": tp, "pp": pp, "ep": ep}
    if not any(v is not None for v in pinned.values()):
        return
    node = getattr(hardware, "devices_per_node", 1)
    limit = node * max_nodes
    free = {
        "tp": _divisors(spec.num_attention_heads, limit),
        "pp": _divisors(spec.num_layers, limit) or [1],
        "ep": _divisors(spec.num_experts, limit) if spec.is_moe else [1],
    }
    choices = [[v] if v is not None else free[k] for k, v in pinned.items()]
    dense = bool(spec.dense_layers)
    first: str | None = None
    for t in choices[0]:
        for p in choices[1]:
            for e in choices[2]:
                problem = layout_problem(spec, hardware, t, p, e, dense, single_device)
                if problem is None:
                    return
                first = first or problem
    assert first is not None
    named = [k for k, v in pinned.items() if v is not None]
    field = next((k for k in named if first.startswith(f"{k}=")), named[0])
    raise LayoutError(field, first)


def config_layout_error(config: Any, hardware: Any, tp: int | None, pp: int | None,
                        ep: int | None) -> LayoutError | None:
    """``check_layout`` on a model's ``config.json``: the LayoutError pinned degrees raise, or None (also when
    the config cannot be parsed: the plan stage reports that). A model the runtime runs on the transformers
    fallback takes no degree above 1."""
    from contract.model.native import single_device_reason
    from contract.model.spec import parse_config

    try:
        spec = parse_config(config)
        single = single_device_reason(config)
    except Exception:  # noqa: BLE001 - a config the planner cannot read is the plan stage's error to report
        return None
    try:
        check_layout(spec, hardware, tp, pp, ep, single_device=single)
    except LayoutError as exc:
        return exc
    return None


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
        weights += (model.embed_bytes / tp + model.vision_bytes if i == 0 else 0) + (
            model.head_bytes / tp if i == pp - 1 else 0)  # the vision tower: whole on each first-stage device
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
    """Every plan allowed by the rules (``layout_problem``) within max_nodes; pinned degrees in ``fixed`` may go
    past max_nodes, never past the rules."""
    spec = model.spec
    max_devices = hw.devices_per_node * model.settings.max_nodes
    node = max_devices if hw.shared_memory else hw.devices_per_node
    one = bool(model.single_device)  # the fallback: tp = pp = ep = 1 is the only layout (pins above 1 refused)
    tps = [fixed["tp"]] if fixed.get("tp") else [1] if one else _divisors(spec.num_attention_heads, node)
    if fixed.get("ep"):
        eps = [fixed["ep"]]
    else:
        eps = _divisors(spec.num_experts, max_devices) if spec.is_moe and not one else [1]
    if fixed.get("pp"):
        pps = [fixed["pp"]]
    elif one:
        pps = [1]
    else:
        powers = {1 << k for k in range(max_devices.bit_length()) if 1 << k <= spec.num_layers}
        pps = sorted(set(_divisors(spec.num_layers, max_devices)) | powers)
    pinned = any(fixed.values())
    plans = []
    for tp in tps:
        for ep in eps:
            for pp in pps:
                devices = pp * max(tp, ep)
                if devices > max_devices and not pinned:
                    continue
                if layout_problem(spec, hw, tp, pp, ep, model.has_dense, model.single_device) is None:
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
