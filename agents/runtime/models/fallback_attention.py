"""The transformers fallback on the runtime's paged KV cache: an attention implementation registered with
transformers (``AttentionInterface``) that each attention module of the model calls in place of its own. It writes
the layer's new K/V into the paged cache at the step's slots and attends over the cache with the runtime's own
``layers.attention.Attention`` (chunked prefill, the vectorised decode, the native CPU kernels), reading the step's
``AttentionMetadata`` from a context variable the fallback sets around its forward. transformers' own cache is
off (``use_cache=False``); the batch runs as one packed sequence (batch 1 × all tokens) with explicit
``position_ids``, the sequence boundaries in the metadata.

Whether an architecture can be routed so is found out, not listed: ``probe`` runs the model once on a short prompt
with a recording implementation (which modules call attention, with what heads, head size, scale, sliding window
and extra arguments), and ``self_check`` runs the same prompt through the paged path in two chunks and compares
each layer's queries and keys and the final hidden states with the recording. An architecture that fails any of it
(no AttentionInterface support, recurrent or convolutional layers beside attention, attention sinks, a position
bias, cross-attention, per-layer KV shapes, positions not taken from ``position_ids``) keeps the recompute path, with
the reason. Soft-capped attention logits (Gemma-2) run on the paged cache through ``CappedAttention``."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from agents.runtime.context import ForwardContext
from agents.runtime.layers.attention import Attention, AttentionMetadata

log = logging.getLogger(__name__)
PAGED = "day0_paged"  # the serving implementation: K/V through the runtime's paged cache
PROBE = "day0_probe"  # the recording one: what each attention module calls with
PROBE_LENGTH = 6
FIRST_CHUNK = 4  # the self-check's prefill chunk; the rest follows with the first part cached
# attention arguments the paged path honours (or that change nothing at inference); any other one with a value
# set is a feature it does not implement
HANDLED_ARGS = frozenset({"dropout", "scaling", "sliding_window", "softcap", "position_ids", "use_cache", "cache_position",
                          "output_attentions", "return_dict", "is_causal", "layer_idx", "past_key_values",
                          "position_embeddings"})
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


class RoutingRefused(Exception):
    """The architecture's attention cannot run on the paged cache; the message says why."""


@dataclass
class LayerShape:
    """One attention call of the probe: the module and what the paged layer needs to replace it."""

    module: nn.Module
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None
    softcap: float | None
    query: torch.Tensor  # [H, L, D] the probe's post-rotary queries, for the self-check
    key: torch.Tensor  # [Hkv, L, D]


@dataclass
class _Step:
    meta: AttentionMetadata
    layers: dict[int, Attention]  # id(attention module) -> its paged layer
    captured: list[tuple[int, torch.Tensor, torch.Tensor]] | None = None  # (module id, q, k), self-check only


@dataclass
class _Recording:
    calls: list[tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]] = field(default_factory=list)


_STEP: ContextVar[_Step | None] = ContextVar("day0_fallback_step", default=None)
_RECORDING: ContextVar[_Recording | None] = ContextVar("day0_fallback_probe", default=None)


def _paged_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention call -> the runtime's paged attention. query: [1, H, T, D], key/value: [1, Hkv, T,
    D] -> ([1, T, H, D], no weights). The mask is ignored: the metadata holds each sequence's bounds."""
    step = _STEP.get()
    if step is None:
        raise RuntimeError("the fallback's paged attention ran outside a runtime step (no metadata set)")
    layer = step.layers.get(id(module))
    if layer is None:
        raise RuntimeError(f"attention module {type(module).__name__} was not seen by the probe")
    q = query[0].transpose(0, 1).contiguous()  # q: [T, H, D], heads contiguous for the native kernels
    k = key[0].transpose(0, 1)  # k: [T, Hkv, D]
    v = value[0].transpose(0, 1)
    if step.captured is not None:
        step.captured.append((id(module), q, k))
    out = layer(q, k, v, step.meta)  # out: [T, H * D]
    return out.view(1, q.shape[0], layer.num_heads, layer.head_dim), None


def _probe_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Records the call, then attends causally over the one probe sequence, eagerly, with the sliding window and
    logit soft-cap it is given (the self-check compares the paged path's final hidden states with this)."""
    recording = _RECORDING.get()
    if recording is None:
        raise RuntimeError("the fallback's probe attention ran outside a probe")
    recording.calls.append((module, query, key, value, kwargs))
    heads, q_len, k_len = query.shape[1], query.shape[2], key.shape[2]
    if k_len != q_len or key.shape[1] == 0 or heads % key.shape[1] or value.shape[-1] != query.shape[-1]:
        return torch.zeros(1, q_len, heads, value.shape[-1], dtype=query.dtype, device=query.device), None
    group = heads // key.shape[1]
    k = key.repeat_interleave(group, 1)  # k: [1, H, L, D]
    v = value.repeat_interleave(group, 1)
    scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
    scores = torch.matmul(query, k.transpose(2, 3)) * scale  # scores: [1, H, L, L]
    if kwargs.get("softcap"):
        scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
    pos = torch.arange(q_len, device=query.device)
    mask = pos[None, :] <= pos[:, None]  # mask: [L, L], causal
    if kwargs.get("sliding_window"):
        mask &= pos[None, :] > pos[:, None] - int(kwargs["sliding_window"])
    probs = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1).to(query.dtype)
    return torch.matmul(probs, v).transpose(1, 2), None  # [1, L, H, D]


def register() -> None:
    """Register both implementations with transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PAGED, _paged_attention)
    AttentionInterface.register(PROBE, _probe_attention)


def configs_of(model: nn.Module) -> list[Any]:
    """Every distinct config object of the model and its submodules: each attention module reads the
    implementation from its own."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation_internal"):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


@contextmanager
def implementation(configs: list[Any], name: str) -> Iterator[None]:
    """Run the model's attention modules with the registered implementation ``name`` (no mask is built for it)."""
    before = [cfg._attn_implementation_internal for cfg in configs]
    for cfg in configs:
        cfg._attn_implementation_internal = name
    try:
        yield
    finally:
        for cfg, value in zip(configs, before, strict=True):
            cfg._attn_implementation_internal = value


def _layer_shape(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 kwargs: dict[str, Any]) -> LayerShape:
    name = type(module).__name__
    if key.shape[2] != query.shape[2]:
        raise RoutingRefused(f"{name} attends over {key.shape[2]} keys for {query.shape[2]} queries "
                             "(cross-attention or memory tokens)")
    if value.shape[-1] != key.shape[-1]:
        raise RoutingRefused(f"{name} has value head size {value.shape[-1]} and key head size {key.shape[-1]}")
    heads, kv_heads, head_dim = query.shape[1], key.shape[1], key.shape[-1]
    if query.shape[-1] != head_dim or heads % kv_heads:
        raise RoutingRefused(f"{name}: {heads} query heads of {query.shape[-1]} over {kv_heads} KV heads of "
                             f"{head_dim}")
    for arg, value_ in kwargs.items():
        if arg == "is_causal" and value_ is False:
            raise RoutingRefused(f"{name} attends bidirectionally (is_causal False)")
        if arg not in HANDLED_ARGS and value_ is not None and value_ is not False:
            raise RoutingRefused(f"{name} passes attention argument {arg!r} (e.g. a logit soft-cap, attention "
                                 "sinks or a position bias), which the paged attention does not implement")
    scale = kwargs.get("scaling")
    window = kwargs.get("sliding_window")
    cap = kwargs.get("softcap")
    return LayerShape(module, heads, kv_heads, head_dim, float(scale) if scale is not None else head_dim**-0.5,
                      int(window) if window else None, float(cap) if cap else None, query[0].detach().clone(),
                      key[0].detach().clone())


def probe(hf_model: nn.Module, num_layers: int | None, device: torch.device) -> tuple[list[LayerShape], torch.Tensor]:
    """Each attention layer of ``hf_model``'s decoder, in call order, and the final hidden states [L, hidden], from
    one forward of a short prompt; raises ``RoutingRefused`` naming what the paged path cannot run."""
    name = type(hf_model).__name__
    if not getattr(hf_model, "_supports_attention_backend", False):
        raise RoutingRefused(f"{name} does not route its attention through transformers' AttentionInterface")
    text = hf_model.config.get_text_config()
    other = sorted({t for t in (getattr(text, "layer_types", None) or []) if t not in ATTENTION_LAYER_TYPES})
    if other:
        raise RoutingRefused(f"{name} has layers of type {', '.join(other)}: state outside the KV cache")
    register()
    recording = _Recording()
    ids = torch.arange(1, PROBE_LENGTH + 1, device=device)[None]  # [1, L]
    token = _RECORDING.set(recording)
    try:
        with implementation(configs_of(hf_model), PROBE), torch.inference_mode():
            out = hf_model.base_model(input_ids=ids, position_ids=torch.arange(PROBE_LENGTH, device=device)[None],
                                      use_cache=False)
    finally:
        _RECORDING.reset(token)
    if not recording.calls:
        raise RoutingRefused(f"{name} made no attention call through the AttentionInterface")
    modules = [call[0] for call in recording.calls]
    if len({id(m) for m in modules}) != len(modules):
        raise RoutingRefused(f"{name} calls one attention module more than once per forward (shared layers)")
    if num_layers is not None and len(modules) != num_layers:
        raise RoutingRefused(f"{name} has {len(modules)} attention calls for {num_layers} layers: the other layers "
                             "keep state outside the KV cache")
    shapes = [_layer_shape(*call) for call in recording.calls]
    kinds = {(s.num_kv_heads, s.head_dim) for s in shapes}
    if len(kinds) > 1:
        raise RoutingRefused(f"{name} has per-layer KV shapes {sorted(kinds)} (one cache shape for all layers only)")
    return shapes, out.last_hidden_state[0]


class CappedAttention(Attention):
    """Attention whose logits are soft-capped (``cap * tanh(scores / cap)`` before the mask, as transformers' eager
    attention does): the runtime's paged cache and slots, the attention itself in torch, one sequence at a time
    (no native kernel caps its logits)."""

    def __init__(self, *args: Any, softcap: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.softcap = softcap

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, Hkv, D] -> [T, H * D]."""
        ctx = meta.ctx
        if self.k_cache is None:
            raise RuntimeError("paged attention called before bind_kv_cache")
        self._store(k, v, meta)
        out = torch.empty(q.shape[0], self.num_heads * self.head_dim, dtype=q.dtype, device=q.device)
        starts, k_lens = ctx.cu_seqlens_q.tolist(), ctx.seqlens_k.tolist()
        for i, k_len in enumerate(k_lens):
            start, n = starts[i], starts[i + 1] - starts[i]
            if n == 0:
                continue
            keys, values = self._gather_sequence(ctx, i, k_len)  # keys: [Lk, Hkv, D]
            qi = q[start : start + n].transpose(0, 1)  # qi: [H, Lq, D]
            ki = keys.to(q.dtype).transpose(0, 1).repeat_interleave(self.group, 0)  # ki: [H, Lk, D]
            vi = values.to(q.dtype).transpose(0, 1).repeat_interleave(self.group, 0)
            scores = torch.tanh(torch.matmul(qi, ki.transpose(1, 2)) * (self.scale / self.softcap)) * self.softcap
            q_pos = torch.arange(k_len - n, k_len, device=q.device)[:, None]  # [Lq, 1]
            k_pos = torch.arange(k_len, device=q.device)[None, :]  # [1, Lk]
            mask = k_pos <= q_pos
            if self.sliding_window is not None:
                mask &= k_pos > q_pos - self.sliding_window
            probs = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1).to(q.dtype)
            out[start : start + n] = torch.matmul(probs, vi).transpose(0, 1).flatten(1)  # [Lq, H * D]
        return out


class PagedRouter:
    """The paged layers of a probed model, bound to the engine's caches, and the step context around a forward."""

    def __init__(self, shapes: list[LayerShape], configs: list[Any]) -> None:
        self.shapes = shapes
        self.configs = configs
        self.layers = {id(s.module): (CappedAttention(s.num_heads, s.num_kv_heads, s.head_dim, s.scale,
                                                      s.sliding_window, softcap=s.softcap) if s.softcap else
                                      Attention(s.num_heads, s.num_kv_heads, s.head_dim, s.scale, s.sliding_window))
                       for s in shapes}

    @property
    def num_kv_heads(self) -> int:
        return self.shapes[0].num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.shapes[0].head_dim

    def bind(self, caches: list[tuple[torch.Tensor, ...]]) -> None:
        if len(caches) != len(self.shapes):
            raise ValueError(f"{len(caches)} KV caches for {len(self.shapes)} attention layers")
        for shape, (k_cache, v_cache) in zip(self.shapes, caches, strict=True):
            self.layers[id(shape.module)].bind(k_cache, v_cache)

    @contextmanager
    def step(self, ctx: ForwardContext, captured: list | None = None) -> Iterator[None]:
        """The attention modules of the model, for one forward, read ``ctx`` through the paged layers."""
        token = _STEP.set(_Step(AttentionMetadata.build(ctx), self.layers, captured))
        try:
            with implementation(self.configs, PAGED):
                yield
        finally:
            _STEP.reset(token)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    scale = float(want.float().abs().max())
    return float((got.float() - want.float()).abs().max()) <= tol * max(scale, 1e-6)


def self_check(base: nn.Module, router: PagedRouter, probe_hidden: torch.Tensor, dtype: torch.dtype,
               device: torch.device) -> None:
    """The probe prompt again through the paged path, as a chunk of ``FIRST_CHUNK`` tokens and then the rest over
    the cached first part (temporary caches, unbound afterwards): each layer's queries and keys must equal the
    probe's (positions taken from ``position_ids``, nothing carried outside the cache) and so must the final hidden
    states. Raises ``RoutingRefused`` otherwise."""
    block = 4
    blocks = -(-PROBE_LENGTH // block)
    caches = [(torch.zeros(blocks, block, router.num_kv_heads, router.head_dim, dtype=dtype, device=device),
               torch.zeros(blocks, block, router.num_kv_heads, router.head_dim, dtype=dtype, device=device))
              for _ in router.shapes]
    router.bind(caches)
    table = torch.arange(blocks, dtype=torch.int32, device=device)[None]  # [1, blocks]
    ids = torch.arange(1, PROBE_LENGTH + 1, device=device)
    captured: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    hidden = []
    with torch.inference_mode():
        for lo, hi in ((0, FIRST_CHUNK), (FIRST_CHUNK, PROBE_LENGTH)):
            ctx = ForwardContext(
                cu_seqlens_q=torch.tensor([0, hi - lo], dtype=torch.int32, device=device),
                seqlens_k=torch.tensor([hi], dtype=torch.int32, device=device), max_seqlen_q=hi - lo,
                max_seqlen_k=hi, slot_mapping=torch.arange(lo, hi, device=device), block_tables=table,
                is_decode=hi - lo == 1)
            pos = torch.arange(lo, hi, device=device)[None]  # [1, n]
            with router.step(ctx, captured):
                hidden.append(base(input_ids=ids[lo:hi][None], position_ids=pos, use_cache=False).last_hidden_state[0])
    for layer in router.layers.values():
        layer.k_cache = layer.v_cache = layer._k_slots = layer._v_slots = None
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    for i, shape in enumerate(router.shapes):
        chunks = [c for c in captured if c[0] == id(shape.module)]
        q = torch.cat([c[1] for c in chunks]).transpose(0, 1)  # q: [H, L, D]
        k = torch.cat([c[2] for c in chunks]).transpose(0, 1)  # k: [Hkv, L, D]
        if not (_close(q, shape.query, tol) and _close(k, shape.key, tol)):
            raise RoutingRefused(f"layer {i}'s queries or keys differ when the prompt is split into chunks: the "
                                 "model does not take its positions from position_ids alone")
    if not _close(torch.cat(hidden), probe_hidden, tol):  # [L, hidden] each
        raise RoutingRefused("the final hidden states differ when the prompt is split into chunks: the model "
                             "carries state between tokens outside attention")


def route(hf_model: nn.Module, num_layers: int | None, dtype: torch.dtype, device: torch.device, *,
          takes_images: bool = False) -> tuple[PagedRouter | None, str | None]:
    """(the paged layers of ``hf_model``, None) after the probe and the self-check, or (None, why not), logged."""
    name = type(hf_model).__name__
    try:
        if device.type == "meta":
            raise RoutingRefused("built on the meta device (shapes only): nothing to probe")
        if takes_images:
            raise RoutingRefused("a vision-language model computes its multimodal positions over the whole sequence")
        shapes, hidden = probe(hf_model, num_layers, device)
        router = PagedRouter(shapes, configs_of(hf_model))
        self_check(hf_model.base_model, router, hidden, dtype, device)
    except RoutingRefused as exc:
        log.warning("fallback %s keeps the recompute path (no KV cache, no batching): %s", name, exc)
        return None, str(exc)
    log.info("fallback %s runs on the paged KV cache (%d attention layers)", name, len(shapes))
    return router, None


@contextmanager
def capture_outputs(modules: Iterable[nn.Module]) -> Iterator[list[torch.Tensor]]:
    """The outputs of ``modules`` (their first element when a tuple), in call order, while the block runs."""
    captured: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: captured.append(out[0] if isinstance(out, tuple) else out))
             for m in modules]
    try:
        yield captured
    finally:
        for hook in hooks:
            hook.remove()
