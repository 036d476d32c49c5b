"""Operator alignment (the ``align.ops`` list) on the runtime's own modules.

The model the load stage built is walked module by module (its *module inventory*); every module class it uses is
matched to a check, and each check runs **that instance's own forward** — its dense-linear path (oneDNN or MKL,
row- or column-major weights as the model stores them), its attention (no cache, paged prefill, paged decode), its
router class, its rotary layout, MLA, RMSNorm, SwiGLU and MoE experts — with its parameters swapped for fixed
random values (seed 0) through ``torch.func.functional_call``. The values are drawn in the checkpoint's own form
(q/k/v, gate/up, per-expert w1/w3/w2) and packed by the parameters' own ``weight_loader``; the reference
(``refs``) is float64 math written from the family's published definition and the model's ``config.json``,
fed those same checkpoint tensors. A module class with parameters (or a leaf) that no check covers is listed as
``unchecked``, never silently passed; the model on the transformers fallback has nothing of the runtime's own to
check and says so.

Inputs are drawn in float32, rounded once to the module's dtype, and both sides start from the rounded values.
Metrics per operator over the whole output (``a`` reference, ``b`` target, float64): ``cosine``; ``max_abs_err``;
``max_rel_err`` = ``max |a - b| / max(max |a|, eps)`` (normwise: elementwise ratios explode near zero). A router's
output is compared as the dense ``[tokens, experts]`` gate matrix (zero where an expert is not chosen), so a
different expert choice shows in the numbers; it also reports ``topk_agreement``, the share of tokens whose expert
set is the same on both sides. A disagreement where the reference's k-th and (k+1)-th scores are within
``near_tie_margin`` is a near-tie: that token is left out and does not fail the check."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from agents.pipeline.stages.align import refs as ref
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.models import paged_context, target_model
from agents.pipeline.support.op_capture import OperatorRecorder
from agents.pipeline.thresholds import OPS as OP_THRESHOLDS
from agents.runtime.context import ForwardContext

DEFAULT_THRESHOLDS: dict[str, float] = OP_THRESHOLDS
TOKENS = 32
BLOCK_SIZE = 16
MAX_CHECK_ELEMENTS = 1 << 26  # a module with more parameters than this is too large to re-randomise here
_EPS = 1e-12
MAX_REL_ERR_DEFINITION = "max|ref - target| / max(max|ref|, 1e-12) over the tensor"


def compare(reference: torch.Tensor, out: torch.Tensor) -> dict[str, float]:
    """Cosine, max absolute and max (normwise) relative error of ``out`` against ``reference``."""
    if reference.shape != out.shape:
        raise StageFailed(f"shape mismatch: reference {tuple(reference.shape)} vs target {tuple(out.shape)}")
    a = reference.detach().to("cpu", torch.float64).flatten()
    b = out.detach().to("cpu", torch.float64).flatten()
    if not torch.isfinite(b).all():
        return {"cosine": float("nan"), "max_rel_err": float("inf"), "max_abs_err": float("inf")}
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    denom = a.norm().item() * b.norm().item()
    cosine = (a @ b).item() / denom if denom > 0 else (1.0 if diff == 0 else 0.0)
    return {"cosine": cosine, "max_rel_err": diff / max(a.abs().max().item(), _EPS), "max_abs_err": diff}


# ---------------------------------------------------------------- the module under test, re-randomised


@dataclass
class Probe:
    """One runtime module, its path in the model, and the random checkpoint tensors it was given."""

    path: str
    module: nn.Module
    config: dict[str, Any]
    device: torch.device
    dtype: torch.dtype  # the model's dtype: what the module receives in the model
    seed: int
    params: dict[str, torch.Tensor] = field(default_factory=dict)  # for functional_call, the runtime's layout
    ckpt: dict[tuple[str, Any], torch.Tensor] = field(default_factory=dict)  # (param, shard) -> float64 values
    draws: int = 0
    aten: set[str] = field(default_factory=set)  # the aten operators the module's own code ran

    @contextlib.contextmanager
    def target(self) -> Iterator[None]:
        """Runs the module's code under a recorder: the operators the check exercised (the reference's math is
        never recorded)."""
        recorder = OperatorRecorder()
        with torch.inference_mode(), recorder:
            yield
        self.aten.update(str(op) for op in recorder.ops)

    def w(self, name: str, shard: Any = None) -> torch.Tensor | None:
        return self.ckpt.get((name, shard))

    def call(self, *args: Any, method: str = "forward") -> Any:
        with self.target():
            if method == "forward":
                return functional_call(self.module, self.params, args)
            with _swapped(self.module, self.params):
                return getattr(self.module, method)(*args)

    def input(self, *shape: int, scale: float = 1.0) -> tuple[torch.Tensor, ...]:
        """(target tensor on the device in the model's dtype, the same values in float64 on CPU)."""
        self.draws += 1
        g = torch.Generator().manual_seed(self.seed * 1000 + self.draws)
        value = (torch.randn(*shape, generator=g) * scale).to(self.dtype)
        return value.to(self.device), value.double()


def _draw(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "e_score_correction_bias":
        return torch.randn(shape, generator=g) * 0.3  # large enough to change which experts a token picks
    if len(shape) == 1:
        return torch.randn(shape, generator=g) * 0.1 + (0.0 if leaf == "bias" else 1.0)  # biases ~0, norms ~1
    return torch.randn(shape, generator=g) * shape[-1] ** -0.5


def make_probe(path: str, module: nn.Module, config: dict[str, Any], dtype: torch.dtype, seed: int,
               device: torch.device | str | None = None) -> Probe:
    """The module with every parameter replaced by random checkpoint-form values loaded through its own
    ``weight_loader`` into a tensor of the parameter's dtype, device and strides (a column-major weight stays
    column-major, so the linear takes the path the model takes). ``device``: where its inputs go (default: where
    its parameters or buffers are; a module with neither, like attention, needs the model's)."""
    g = torch.Generator().manual_seed(seed)
    if device is None:
        held = [*module.parameters(), *module.buffers()]
        device = held[0].device if held else torch.device("cpu")
    probe = Probe(path, module, config, torch.device(device), dtype, seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            fresh = nn.Parameter(torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device),
                                 requires_grad=False)
            loader = getattr(p, "weight_loader", None)
            for shard in getattr(p, "shards", [None]) if loader is not None else [None]:
                shape = tuple(p.checkpoint_shape(shard)) if loader is not None else tuple(p.shape)
                value = _draw(name, shape, g).to(p.dtype)
                probe.ckpt[(name, shard)] = value.double()
                if loader is not None:
                    loader(fresh, value.to(p.device), shard)
                else:
                    fresh.copy_(value)
            probe.params[name] = fresh
    return probe


@contextlib.contextmanager
def _swapped(module: nn.Module, params: dict[str, torch.Tensor]) -> Iterator[None]:
    """The module's parameters replaced by ``params`` for a method other than ``forward``."""
    from torch.nn.utils.stateless import _reparametrize_module

    with _reparametrize_module(module, params):
        yield


@contextlib.contextmanager
def _attrs(obj: Any, **values: Any) -> Iterator[None]:
    """Set attributes for the duration (a cache bound to a module of the model), then put the old ones back."""
    old = {k: getattr(obj, k) for k in values}
    try:
        for k, v in values.items():
            setattr(obj, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


# ---------------------------------------------------------------- forward contexts


def _meta(ctx: ForwardContext, rotary: Any = None, positions: torch.Tensor | None = None,
          dtype: torch.dtype | None = None) -> Any:
    from agents.runtime.layers.attention import AttentionMetadata

    meta = AttentionMetadata.build(ctx)
    if rotary is not None:
        meta.cos, meta.sin = rotary.cos_sin(positions, int(positions.max()) + 1, dtype)
    return meta


def _positions(config: dict[str, Any], n: int) -> torch.Tensor:
    """Spread positions (large angles) within the model's context."""
    limit = max(n, min(int(config.get("max_position_embeddings") or 4096), 4096))
    return torch.arange(n, dtype=torch.int64) * 97 % limit


def _rope_freqs(config: dict[str, Any], rotary: Any) -> tuple[torch.Tensor, float, str | None]:
    """The reference's inverse frequencies and cos/sin scaling, with a note when they come from the runtime."""
    freqs = ref.inv_freq(config, rotary.rotary_dim)
    if freqs is not None:
        return freqs, 1.0, None
    kind = ref.rope_parameters(config)["rope_type"]
    return rotary.inv_freq.detach().cpu().double(), float(rotary.scaling), (
        f"rope_type {kind!r}: frequencies taken from the runtime; rotation layout and application checked")


# ---------------------------------------------------------------- checks (each returns report rows)

Row = dict[str, Any]


def _row(op: str, probe: Probe, reference: torch.Tensor, out: torch.Tensor, **extra: Any) -> Row:
    return {"op": op, "module": type(probe.module).__name__, "where": probe.path, **compare(reference, out), **extra}


def check_linear(probe: Probe) -> list[Row]:
    """The dense-linear path, as a prefill (a GEMM) and as a decode step (a matrix-vector product)."""
    module = probe.module

    def packed(name: str) -> torch.Tensor | None:  # the checkpoint shards in the order the loader packs them
        param = getattr(module, name, None)
        if param is None:
            return None
        return torch.cat([probe.ckpt[(name, shard)] for shard in getattr(param, "shards", [None])])

    weight, bias = packed("weight"), packed("bias")
    x, x64 = probe.input(TOKENS, weight.shape[1])
    rows = [_row("linear", probe, ref.linear(x64, weight, bias), probe.call(x), phase="prefill")]
    rows.append(_row("linear", probe, ref.linear(x64[:1], weight, bias), probe.call(x[:1]), phase="decode"))
    return rows


def check_rms_norm(probe: Probe) -> list[Row]:
    dim = probe.w("weight").shape[0]
    x, x64 = probe.input(TOKENS, dim)
    eps = float(probe.config.get("rms_norm_eps", 1e-6))
    return [_row("rms_norm", probe, ref.rms_norm(x64, probe.w("weight"), eps), probe.call(x))]


def check_embedding(probe: Probe) -> list[Row]:
    weight = probe.w("weight")
    ids = torch.randint(0, weight.shape[0], (TOKENS,), generator=torch.Generator().manual_seed(probe.seed))
    if hasattr(probe.module, "compute_logits"):
        x, x64 = probe.input(TOKENS, weight.shape[1])
        return [_row("lm_head", probe, ref.linear(x64, weight), probe.call(x, method="compute_logits"))]
    return [_row("embedding", probe, weight[ids], probe.call(ids.to(probe.device)))]


def check_rope(probe: Probe) -> list[Row]:
    rotary = probe.module
    c = probe.config
    head_dim = int(c.get("qk_rope_head_dim") or c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    heads = max(1, min(int(c.get("num_attention_heads") or 4), 8))
    positions = _positions(c, TOKENS)
    q, q64 = probe.input(TOKENS, heads, head_dim)
    freqs, scaling, note = _rope_freqs(c, rotary)
    with probe.target():
        out, _ = rotary(positions.to(probe.device), q, q)
    expected = ref.rope(q64, positions, freqs, interleaved=ref.rope_interleaved(c), scaling=scaling)
    row = _row("rope", probe, expected, out, interleaved=bool(getattr(rotary, "interleaved", False)))
    if note:
        row["note"] = note
    return [row]


def check_attention(probe: Probe) -> list[Row]:
    """Causal GQA attention: no cache, and paged (prefill of all but the last token, then a decode step)."""
    attn, c = probe.module, probe.config
    scale = float(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]) ** -0.5
    window = c.get("sliding_window") if c.get("use_sliding_window", True) else None
    q, q64 = probe.input(TOKENS, attn.num_heads, attn.head_dim)
    k, k64 = probe.input(TOKENS, attn.num_kv_heads, attn.head_dim, scale=1.01)
    v, v64 = probe.input(TOKENS, attn.num_kv_heads, attn.head_dim, scale=0.99)
    expected = ref.attention(q64, k64, v64, scale, window=window)
    meta = _meta(ForwardContext.for_prompts([TOKENS], device=q.device))
    with probe.target():
        plain = attn(q, k, v, meta)
    rows = [_row("attention", probe, expected, plain, phase="prefill")]
    n_blocks = -(-TOKENS // BLOCK_SIZE)
    cache = [torch.zeros(n_blocks, BLOCK_SIZE, attn.num_kv_heads, attn.head_dim, dtype=q.dtype, device=q.device)
             for _ in range(2)]
    n = TOKENS - 1
    metas = _meta(paged_context(0, n, n_blocks, q.device)), _meta(paged_context(n, 1, n_blocks, q.device))
    with _attrs(attn, k_cache=None, v_cache=None, _k_slots=None, _v_slots=None), probe.target():
        attn.bind(*cache)
        first = attn(q[:n], k[:n], v[:n], metas[0])
        last = attn(q[n:], k[n:], v[n:], metas[1])
    rows.append(_row("attention", probe, expected, torch.cat([first, last]), phase="paged prefill + decode"))
    return rows


def check_self_attention(probe: Probe) -> list[Row]:
    """The whole attention block: packed QKV, QK-norm (Qwen3), rope, attention, output projection."""
    block, c = probe.module, probe.config
    rotary = block.rotary[0]
    names = {"q": ("qkv_proj.weight", "q"), "k": ("qkv_proj.weight", "k"), "v": ("qkv_proj.weight", "v"),
             "q_bias": ("qkv_proj.bias", "q"), "k_bias": ("qkv_proj.bias", "k"), "v_bias": ("qkv_proj.bias", "v"),
             "o": ("o_proj.weight", None), "o_bias": ("o_proj.bias", None), "q_norm": ("q_norm.weight", None),
             "k_norm": ("k_norm.weight", None)}
    w = {key: probe.ckpt[k] for key, k in names.items() if k in probe.ckpt}
    x, x64 = probe.input(TOKENS, w["q"].shape[1])
    positions = _positions(c, TOKENS)
    freqs, scaling, note = _rope_freqs(c, rotary)
    if scaling != 1.0:
        raise _Unchecked(f"rope scaling {scaling} is not modelled by the reference attention block")
    expected = ref.self_attention(x64, w, c, positions, freqs)
    meta = _meta(ForwardContext.for_prompts([TOKENS], device=x.device), rotary, positions.to(x.device), x.dtype)
    row = _row("self_attention", probe, expected, probe.call(x, meta), qk_norm=block.q_norm is not None)
    if note:
        row["note"] = note
    return [row]


def check_mla(probe: Probe) -> list[Row]:
    """Multi-head latent attention: no cache (keys up-projected), and paged (prefill, then the absorbed decode)."""
    block, c = probe.module, probe.config
    rotary = block.rotary[0]
    names = {"q_a": "q_a_proj.weight", "q_a_bias": "q_a_proj.bias", "q_a_norm": "q_a_layernorm.weight",
             "q_b": "q_b_proj.weight", "q": "q_proj.weight", "kv_a": "kv_a_proj_with_mqa.weight",
             "kv_a_bias": "kv_a_proj_with_mqa.bias", "kv_a_norm": "kv_a_layernorm.weight", "kv_b": "kv_b_proj.weight",
             "o": "o_proj.weight", "o_bias": "o_proj.bias"}
    w = {key: probe.ckpt[(name, None)] for key, name in names.items() if (name, None) in probe.ckpt}
    x, x64 = probe.input(TOKENS, w["kv_a"].shape[1])
    positions = _positions(c, TOKENS)
    freqs, scaling, note = _rope_freqs(c, rotary)
    expected = ref.mla(x64, w, c, positions, freqs, scaling)
    pos = positions.to(x.device)
    meta = _meta(ForwardContext.for_prompts([TOKENS], device=x.device), rotary, pos, x.dtype)
    rows = [_row("mla", probe, expected, probe.call(x, meta), phase="prefill")]
    n_blocks, n = -(-TOKENS // BLOCK_SIZE), TOKENS - 1
    cache = torch.zeros(n_blocks, BLOCK_SIZE, block.latent_dim, dtype=x.dtype, device=x.device)
    with _attrs(block, cache=cache):
        first = probe.call(x[:n], _meta(paged_context(0, n, n_blocks, x.device), rotary, pos[:n], x.dtype))
        last = probe.call(x[n:], _meta(paged_context(n, 1, n_blocks, x.device), rotary, pos[n:], x.dtype))
    rows.append(_row("mla", probe, expected, torch.cat([first, last]), phase="paged prefill + absorbed decode"))
    for row in rows if note else []:
        row["note"] = note
    return rows


def check_swiglu(probe: Probe) -> list[Row]:
    gate, up = probe.ckpt[("gate_up_proj.weight", 0)], probe.ckpt[("gate_up_proj.weight", 1)]
    down = probe.ckpt[("down_proj.weight", None)]
    x, x64 = probe.input(TOKENS, gate.shape[1])
    return [_row("swiglu_mlp", probe, ref.swiglu(x64, gate, up, down), probe.call(x))]


def check_router(probe: Probe, th: dict[str, float]) -> list[Row]:
    """The model's own router class against the family's published routing rule (from ``model_type``)."""
    c = probe.config
    weight = probe.w("weight")
    bias = probe.w("e_score_correction_bias")
    if c.get("model_type") in ref.DEEPSEEK_TYPES and (c.get("topk_method") or "noaux_tc") == "noaux_tc" and (
            bias is None):
        bias_missing = True
        bias = _draw("e_score_correction_bias", (weight.shape[0],), torch.Generator().manual_seed(probe.seed)).double()
    else:
        bias_missing = False
    x, x64 = probe.input(TOKENS, weight.shape[1])
    expected = ref.route(x64, weight, bias, c)
    if expected is None:
        raise _Unchecked(f"no reference router for model_type {c.get('model_type')!r}")
    weights, ids = probe.call(x)
    weights, ids = weights.detach().cpu().double(), ids.detach().cpu().long()
    k = expected["ids"].shape[1]
    ref_ids, ref_order = expected["ids"].sort(-1)
    tgt_ids, tgt_order = ids.sort(-1)
    same = (ref_ids == tgt_ids).all(-1)  # [T]
    top = expected["choice"].sort(-1, descending=True).values  # [T, E]
    margin = top[:, k - 1] - (top[:, k] if k < top.shape[1] else float("-inf"))
    near_tie = margin < th["near_tie_margin"]
    hard = same[~near_tie].double().mean().item() if (~near_tie).any() else 1.0
    # the router's output as a dense gate matrix [T, E] (zero for experts not chosen): a different choice is a
    # large error there, so the numbers alone judge it; tokens that disagree only on a near-tie are left out
    keep = same | ~near_tie
    experts = expected["choice"].shape[1]
    dense_ref = torch.zeros(TOKENS, experts, dtype=torch.float64).scatter_(1, expected["ids"], expected["weights"])
    dense_tgt = torch.zeros(TOKENS, experts, dtype=torch.float64).scatter_(1, ids, weights)
    metrics = compare(dense_ref[keep], dense_tgt[keep])
    row = {"op": "router", "module": type(probe.module).__name__, "where": probe.path, **metrics,
           "topk_agreement": same.double().mean().item(), "hard_topk_agreement": hard,
           "near_ties": int((near_tie & ~same).sum().item()), "rule": _router_rule(c)}
    row["_extra_ok"] = hard >= th["moe_topk_agreement"] and not bias_missing
    if bias_missing:
        row["problem"] = "the router has no e_score_correction_bias parameter, which this family's routing uses"
    elif hard < th["moe_topk_agreement"]:
        row["problem"] = (f"expert choice differs from the reference on {int((~same & ~near_tie).sum())} of "
                          f"{TOKENS} tokens (not near-ties)")
    return [row]


def _router_rule(c: dict[str, Any]) -> str:
    if c.get("model_type") in ref.DEEPSEEK_TYPES:
        return (f"{c.get('scoring_func') or 'sigmoid'} scores + correction bias, {c.get('topk_group') or 1} of "
                f"{c.get('n_group') or 1} groups, top-{c['num_experts_per_tok']}, x{c.get('routed_scaling_factor') or 1}")
    return f"softmax top-{c['num_experts_per_tok']}" + (" renormalised" if c.get("model_type") == "mixtral" or
                                                          c.get("norm_topk_prob") else "")


def check_experts(probe: Probe) -> list[Row]:
    """Routed experts with the same (random) routing on both sides, so the check isolates the expert math:
    a prefill batch, and one token (the decode path)."""
    module = probe.module
    n = module.num_experts
    w1 = [probe.ckpt[("w13", (e, "w1"))] for e in range(n)]
    w3 = [probe.ckpt[("w13", (e, "w3"))] for e in range(n)]
    w2 = [probe.ckpt[("w2", (e, "w2"))] for e in range(n)]
    k = max(1, min(int(probe.config.get("num_experts_per_tok") or 2), n))
    g = torch.Generator().manual_seed(probe.seed + 1)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(TOKENS)])  # [T, k]
    weights = torch.rand(TOKENS, k, generator=g).float()  # fp32 as the routers return them
    x, x64 = probe.input(TOKENS, w1[0].shape[1])
    expected = ref.experts(x64, w1, w3, w2, ids, weights.double())
    out = probe.call(x, weights.to(x.device), ids.to(x.device))
    rows = [_row("moe_experts", probe, expected, out, phase="prefill")]
    one = probe.call(x[:1], weights[:1].to(x.device), ids[:1].to(x.device))
    rows.append(_row("moe_experts", probe, expected[:1], one, phase="decode"))
    return rows


class _Unchecked(Exception):
    """The check cannot run on this module; the message says why (the row becomes ``unchecked``)."""


# ---------------------------------------------------------------- the module inventory


def _checkers() -> list[tuple[type, str, Callable[..., list[Row]]]]:
    """(runtime class, check name, check) in matching order (subclasses match their base's check)."""
    from agents.runtime.layers.attention import Attention
    from agents.runtime.layers.embedding import VocabParallelEmbedding
    from agents.runtime.layers.grouped_router import GroupedTopKRouter
    from agents.runtime.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
    from agents.runtime.layers.mla import MLAttention
    from agents.runtime.layers.mlp import SwiGLUMLP
    from agents.runtime.layers.moe import RoutedExperts, TopKRouter
    from agents.runtime.layers.norm import RMSNorm
    from agents.runtime.layers.rotary import RotaryEmbedding
    from agents.runtime.layers.self_attention import SelfAttention

    return [
        (SelfAttention, "self_attention", check_self_attention),
        (MLAttention, "mla", check_mla),
        (Attention, "attention", check_attention),
        (SwiGLUMLP, "swiglu_mlp", check_swiglu),
        (GroupedTopKRouter, "router", check_router),
        (TopKRouter, "router", check_router),
        (RoutedExperts, "moe_experts", check_experts),
        (RMSNorm, "rms_norm", check_rms_norm),
        (RotaryEmbedding, "rope", check_rope),
        (VocabParallelEmbedding, "embedding", check_embedding),
        ((ColumnParallelLinear, RowParallelLinear, ReplicatedLinear), "linear", check_linear),
    ]


def module_inventory(model: nn.Module) -> tuple[list[tuple[str, nn.Module, str, Callable]], list[Row]]:
    """(one instance of every (check, class) the model uses, rows for the module classes no check covers).

    The instance taken is the one with the most parameters (the largest linear takes the oneDNN path if any
    does). Containers (modules with children and no parameters or buffers of their own) are not operators."""
    checkers = _checkers()
    chosen: dict[tuple[str, type], tuple[str, nn.Module, str, Callable]] = {}
    unchecked: dict[type, str] = {}
    for path, module in model.named_modules():
        for cls, name, fn in checkers:
            if isinstance(module, cls):
                key = (name, type(module))
                size = sum(p.numel() for p in module.parameters())
                if key not in chosen or size > sum(p.numel() for p in chosen[key][1].parameters()):
                    chosen[key] = (path, module, name, fn)
                break
        else:
            own = any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))
            leaf = not any(True for _ in module.children())
            if (own or leaf) and type(module) not in unchecked:
                unchecked[type(module)] = path
    rows = [{"op": type(m).__name__, "module": f"{type(m).__module__}.{type(m).__qualname__}", "where": unchecked[type(m)],
             "status": "unchecked", "cosine": None, "max_rel_err": None, "max_abs_err": None, "passed": None,
             "reason": "no operator check covers this runtime module"}
            for m in (dict(model.named_modules())[p] for p in unchecked.values())]
    return sorted(chosen.values(), key=lambda item: (item[2], item[0])), rows


def _label(row: Row) -> str:
    """A row's unique, readable name: the check, its phase, and for linears the layer class."""
    label = row["op"] + (f" {row['phase']}" if row.get("phase") else "")
    return f"{label} ({row['module']})" if row["op"] == "linear" else label


def _verdict(row: Row, th: dict[str, float]) -> Row:
    extra_ok = row.pop("_extra_ok", True)
    cosine, rel = row["cosine"], row["max_rel_err"]
    ok = cosine == cosine and cosine >= th["op_cosine"] and rel <= th["op_max_rel_err"] and extra_ok
    row["passed"] = bool(ok)
    row["status"] = "passed" if ok else "failed"
    return row


def run_checks(model: Any, config: dict[str, Any], *, thresholds: dict[str, float] | None = None,
               progress: Callable[[int, int], None] | None = None, seed: int = 0) -> list[Row]:
    """The ``align.ops`` rows for the runtime ``model`` (checked rows, then ``unchecked`` ones)."""
    th = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    if getattr(model, "path", "native") == "fallback" or not isinstance(model, nn.Module):
        return [{"op": "all operators", "module": type(model).__name__, "where": "", "status": "unchecked",
                 "cosine": None, "max_rel_err": None, "max_abs_err": None, "passed": None,
                 "reason": "the model runs on the transformers fallback: its operators are transformers' own code, "
                           "the same as the reference's; layers and end-to-end alignment still compare them"}]
    items, unchecked = module_inventory(model)
    first = next(model.parameters())
    dtype, device = getattr(model, "dtype", None) or first.dtype, first.device
    rows: list[Row] = []
    for i, (path, module, name, fn) in enumerate(items, 1):
        size = sum(p.numel() for p in module.parameters())
        base = {"op": name, "check": name, "module": type(module).__name__, "where": path}
        if size > MAX_CHECK_ELEMENTS:
            rows.append({**base, "status": "unchecked", "cosine": None, "max_rel_err": None, "max_abs_err": None,
                         "passed": None, "reason": f"{size:,} parameters: too large to re-randomise for the check"})
            continue
        try:
            probe = make_probe(path, module, config, dtype, seed + i, device)
            produced = fn(probe, th) if name == "router" else fn(probe)
        except _Unchecked as exc:
            rows.append({**base, "status": "unchecked", "cosine": None, "max_rel_err": None, "max_abs_err": None,
                         "passed": None, "reason": str(exc)})
        except (KeyError, RuntimeError, ValueError, StageFailed) as exc:  # the module does not do what it must
            rows.append({**base, "status": "failed", "cosine": None, "max_rel_err": None, "max_abs_err": None,
                         "passed": False, "problem": f"{type(exc).__name__}: {exc}"})
        else:
            rows += [{**_verdict(row, th), "check": row["op"], "op": _label(row), "aten_ops": sorted(probe.aten)}
                     for row in produced]
        if progress:
            progress(i, len(items))
    return rows + unchecked


def run(ctx: StageContext) -> dict[str, Any]:
    """The operator part of the ``align`` section: ``{"ops": [...], "unchecked": [...], "passed", "thresholds"}``."""
    th = {**DEFAULT_THRESHOLDS, **{k: v for k, v in ctx.thresholds.items() if k in DEFAULT_THRESHOLDS}}
    model = target_model(ctx)
    config = ctx.config.get("text_config") or ctx.config  # a vision-language model: its decoder's operators
    ops = run_checks(model, config, thresholds=th,
                     progress=lambda done, total: ctx.progress(done, total, "operators aligned"))
    ctx.check_cancelled()
    checked = [op for op in ops if op["status"] != "unchecked"]
    section = {"ops": ops, "passed": bool(checked) and all(op["passed"] for op in checked), "thresholds": th,
               "unchecked": [op["op"] for op in ops if op["status"] == "unchecked"],
               "max_rel_err_definition": MAX_REL_ERR_DEFINITION}
    inventory = (ctx.results.get("inventory") or {}).get("ops")
    if isinstance(inventory, list):
        section["inventory_coverage"] = inventory_coverage(inventory, ops)
    return section


def inventory_coverage(inventory: list[dict[str, Any]], rows: list[Row]) -> dict[str, Any]:
    """Which of the inventory's aten operators the checks ran through the runtime's modules: ``exercised``
    (operator -> the checks that ran it) and ``not_exercised`` (operators of the model's trace no check ran,
    e.g. the sampler's ``argmax`` or the engine's index bookkeeping)."""
    by_op: dict[str, list[str]] = {}
    for row in rows:
        for name in row.get("aten_ops") or []:
            by_op.setdefault(name, []).append(row["op"])
    traced = sorted({str(op.get("op")) for op in inventory if isinstance(op, dict)})
    phases = {str(op.get("op")): op.get("phases") or [] for op in inventory if isinstance(op, dict)}
    missed = [name for name in traced if name not in by_op]
    # the portal asks a reason for each operator no check runs (its coverage rule, verdicts_align)
    reasons = {name: f"traced in the {' and '.join(phases[name]) or 'model'} pass outside every checked module "
                     "(the engine's sampling, cache or index bookkeeping); the layer and end-to-end comparisons "
                     "run it" for name in missed}
    return {"exercised": {name: sorted(set(by_op[name])) for name in traced if name in by_op},
            "not_exercised": missed, "not_exercised_reasons": reasons}
