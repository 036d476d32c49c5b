"""Decode steps of a native decoder in a few native calls: its layers' attention blocks and dense SwiGLU MLPs run
by ``kernels.decode_layers``, a run of consecutive layers per call, the same kernels and the same order of work as
the layers' own forwards (so the same values), without a Python module call, a parallel region and a result
tensor per op. A layer whose MLP is not a dense SwiGLU over panels (routed experts) ends its run: the native
call returns that layer's post-attention norm and the layer's own MLP module runs it (its hooks included).

``DecodePlan.build`` says whether a model's layers are covered (fp32 CPU weights packed as panels, paged
``Attention`` with a bound fp32 cache, rotate-half RoPE, RMSNorms; one tensor-parallel rank, or TP ranks whose
group is the whole world of one host summing through the shared-memory all-reduce); the model keeps the plan until
its weights or caches change (``DecoderCausalLM.invalidate_decode_plan``). ``usable`` is the per-step check: a
decode step whose every token has a cache slot, nothing tracing the ops, no forward hooks on the layers, every
weight and cache the plan points into still the one the layers hold (a parameter swapped in, as
``torch.func.functional_call`` does, runs the layers' own forwards), and on a TP rank the same shared-memory
segment still active. ``DAY0_NATIVE_DECODE=0`` turns it off for a process.

Under tensor parallelism each rank's descriptors point at its shards (its heads of QKV and O, its slice of gate/up
and down) and the native call sums the O and down projections' partial outputs over the ranks itself, through the
shared-memory all-reduce (``ShmAllReduce.native_comm``), with no return to Python per layer: the same collectives
in the same order and pieces as the layers' own forwards make, so the values are theirs bit for bit, and a rank
that steps aside on a step (a hook on one rank only) still meets its peers' collectives. Ranks across hosts, gloo
kept by ``DAY0_SHM_ALLREDUCE=0``, or a TP group smaller than the world (TP x PP, replicas) keep the layers' own
forwards, with the reason logged."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module_hooks

from agents.runtime import kernels
from agents.runtime.distributed import layout, shm_allreduce
from agents.runtime.distributed.shm_allreduce import ShmAllReduce
from agents.runtime.layers.attention import Attention, AttentionMetadata
from agents.runtime.layers.mlp import SwiGLUMLP
from agents.runtime.layers.norm import RMSNorm
from agents.runtime.layers.self_attention import SelfAttention


def native_decode_enabled() -> bool:
    """``DAY0_NATIVE_DECODE`` (default on; 0/false/no/off turns it off, for a side-by-side measurement or to rule
    it out): whether a new model runs its decode steps through a plan."""
    return os.environ.get("DAY0_NATIVE_DECODE", "1").strip().lower() not in ("0", "false", "no", "off")


def _panels(weight: torch.Tensor, rows: int, cols: int) -> bool:
    """``weight`` is a ``[rows, cols]`` fp32 CPU weight packed as panels (``kernels.pack_panels``)."""
    return (getattr(weight, "panel_rows", 0) == rows and weight.dim() == 3 and weight.shape[1] == cols
            and weight.dtype == torch.float32 and weight.is_cpu and weight.is_contiguous())


def _plain(t: torch.Tensor | None, size: int) -> bool:
    return t is None or (t.dtype == torch.float32 and t.is_cpu and t.is_contiguous() and t.numel() == size)


def _addr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _holder(module: nn.Module, name: str) -> dict:
    """The dict that holds ``module.<name>``: its parameters, or its plain attributes (a cache, a None bias)."""
    return module._parameters if name in module._parameters else module.__dict__


def _rms(norm: nn.Module | None, size: int) -> bool:
    return norm is None or (type(norm) is RMSNorm and _plain(norm.weight, size))


def tp_comm(tp_size: int) -> ShmAllReduce | str | None:
    """The shared-memory all-reduce a native run of TP ranks sums through (None at one rank), or why there is none
    (the layers' own forwards then sum through ``distributed.all_reduce``)."""
    if tp_size == 1:
        return None
    shm = shm_allreduce.active()
    if shm is None:
        return (f"tensor-parallel projections ({tp_size} ranks) without the shared-memory all-reduce (ranks on more "
                "than one host, DAY0_SHM_ALLREDUCE=0, or a segment that could not be made)")
    _handle, size = layout.group("tp")
    if size != tp_size or size != shm.world:
        return (f"a tensor-parallel group of {size} of the world's {shm.world} ranks (the shared-memory all-reduce "
                "sums the whole world)")
    return shm


def _uncovered(layer: nn.Module, hidden: int) -> str | None:
    """Why ``layer``'s attention block is not one ``decode_layers`` runs; None when it is."""
    sa = getattr(layer, "self_attn", None)
    if type(sa) is not SelfAttention or type(sa.attn) is not Attention:
        return f"attention is {type(sa).__name__}, not the paged SelfAttention"
    attn, rotary = sa.attn, sa.rotary[0]
    h, hkv, d = sa.heads, sa.kv_heads, sa.head_dim
    qkv, o = sa.qkv_proj, sa.o_proj
    checks = [
        (qkv.weight.device.type == "cpu", f"weights on {qkv.weight.device.type} (a CPU path)"),
        (all(c is not None and c.dtype == torch.float32 and c.is_cpu and c.is_contiguous()
             for c in (attn.k_cache, attn.v_cache)), "no fp32 CPU KV cache bound"),
        (qkv.tp_size == o.tp_size and o.reduce_results, "an O projection whose partial sums are not reduced"),
        (_panels(qkv.weight, (h + 2 * hkv) * d, hidden) and _panels(o.weight, hidden, h * d),
         "projections not packed as fp32 panels (--pack-weights)"),
        (_plain(qkv.bias, (h + 2 * hkv) * d) and _plain(o.bias, hidden), "biases not fp32"),
        (not rotary.interleaved and rotary.rotary_dim % 2 == 0 and rotary.rotary_dim <= d, "interleaved RoPE"),
        (all(_rms(n, hidden) for n in (layer.input_layernorm, layer.post_attention_layernorm)),
         "layer norms other than fp32 RMSNorm"),
        (all(_rms(n, d) for n in (sa.q_norm, sa.k_norm)) and (sa.q_norm is None) == (sa.k_norm is None)
         and (sa.q_norm is None or sa.q_norm.eps == sa.k_norm.eps), "QK-norms other than one fp32 RMSNorm pair"),
        (hkv > 0 and h % hkv == 0 and d <= kernels.MAX_HEAD_DIM and h // hkv <= kernels.MAX_GROUP,
         f"{h} heads over {hkv} KV heads of {d} past the kernel's buffers"),
    ]
    return next((reason for ok, reason in checks if not ok), None)


def _describe(layer: nn.Module, hidden: int) -> tuple[kernels.DecodeLayer, list[tuple[dict, str, Any]], bool] | str:
    """The layer's ``DecodeLayer``, where the tensors it points into are held (dict, key, tensor), and whether its
    MLP is in it; or why the layer is not covered."""
    reason = _uncovered(layer, hidden)
    if reason is not None:
        return reason
    sa = layer.self_attn
    attn, rotary = sa.attn, sa.rotary[0]
    h, hkv, d = sa.heads, sa.kv_heads, sa.head_dim
    qkv, o = sa.qkv_proj, sa.o_proj
    caches = attn.k_cache, attn.v_cache
    mlp = layer.mlp
    inter = mlp.down_proj.in_local if type(mlp) is SwiGLUMLP else 0
    fused = (inter > 0 and mlp.down_proj.tp_size == o.tp_size and (o.tp_size == 1 or mlp.down_proj.reduce_results)
             and mlp.down_proj.bias is None and mlp.gate_up_proj.bias is None
             and _panels(mlp.down_proj.weight, hidden, inter) and _panels(mlp.gate_up_proj.weight, 2 * inter, hidden))
    # where each tensor the descriptor points into is held: (the dict holding it, its key); usable() checks they
    # still hold the same tensors (a parameter swapped, as torch.func.functional_call does, or caches re-bound)
    held = [(layer.input_layernorm, "weight"), (layer.post_attention_layernorm, "weight"), (qkv, "weight"),
            (qkv, "bias"), (o, "weight"), (o, "bias"), (attn, "k_cache"), (attn, "v_cache")]
    held += [(norm, "weight") for norm in (sa.q_norm, sa.k_norm) if norm is not None]
    if fused:
        held += [(mlp.gate_up_proj, "weight"), (mlp.down_proj, "weight")]
    keep = [(where, name, where.get(name)) for where, name in ((_holder(m, n), n) for m, n in held)]
    desc = kernels.DecodeLayer(
        in_norm=_addr(layer.input_layernorm.weight), post_norm=_addr(layer.post_attention_layernorm.weight),
        qkv=_addr(qkv.weight), qkv_bias=_addr(qkv.bias),
        q_norm=_addr(sa.q_norm.weight) if sa.q_norm is not None else None,
        k_norm=_addr(sa.k_norm.weight) if sa.k_norm is not None else None,
        o=_addr(o.weight), o_bias=_addr(o.bias), k_cache=_addr(caches[0]), v_cache=_addr(caches[1]),
        gate_up=_addr(mlp.gate_up_proj.weight) if fused else None, down=_addr(mlp.down_proj.weight) if fused else None,
        heads=h, kv_heads=hkv, head_dim=d, rot=rotary.rotary_dim, inter=inter if fused else 0,
        window=attn.sliding_window or 0, in_eps=layer.input_layernorm.eps, post_eps=layer.post_attention_layernorm.eps,
        qk_eps=sa.q_norm.eps if sa.q_norm is not None else 0.0, scale=attn.scale,
    )
    return desc, keep, fused


@dataclass
class _Run:
    """Consecutive layers in one native call; ``mlp``: the last layer's own MLP module when the call stops
    before it (routed experts)."""

    layers: ctypes.Array
    mlp: nn.Module | None


class DecodePlan:
    """The native decode of one model's stage layers (see the module docstring)."""

    def __init__(self, runs: list[_Run], modules: list[nn.Module], held: list[tuple[dict, str, Any]], hidden: int,
                 block_size: int, shm: ShmAllReduce | None = None) -> None:
        self.runs, self.modules, self.hidden, self.block_size = runs, modules, hidden, block_size
        self.shm = shm  # TP ranks: the all-reduce the native calls sum through
        self._held = held  # the tensors the descriptors point into and where they sit
        # their storage, alive while the plan lives: even a ``param.data = ...`` swap cannot free what it reads
        self._storage = [tensor.data for _where, _name, tensor in held if tensor is not None]

    @classmethod
    def build(cls, layers: list[nn.Module], hidden: int) -> DecodePlan | str:
        """The plan, or why the layers are not covered."""
        if not layers:
            return "no layers on this stage"
        if not kernels.available():
            return f"native kernels not loaded ({kernels.status()['reason']})"
        runs: list[_Run] = []
        held: list[tuple[dict, str, Any]] = []
        pending: list[kernels.DecodeLayer] = []
        block_size = None
        for i, layer in enumerate(layers):
            described = _describe(layer, hidden)
            if isinstance(described, str):
                return f"layer {i}: {described}"
            desc, tensors, fused = described
            size = layer.self_attn.attn.k_cache.shape[1]
            if block_size not in (None, size):
                return f"layer {i}: a cache block size other than the first layer's"
            block_size = size
            held += tensors
            pending.append(desc)
            if not fused:
                runs.append(cls._run(pending, layer.mlp))
                pending = []
        if pending:
            runs.append(cls._run(pending, None))
        shm = tp_comm(layers[0].self_attn.qkv_proj.tp_size)  # every layer's projections split as the first's
        if isinstance(shm, str):
            return shm
        modules = [m for layer in layers for m in (layer, layer.self_attn, layer.mlp)]
        return cls(runs, modules, held, hidden, block_size, shm)

    @staticmethod
    def _run(descs: list[kernels.DecodeLayer], mlp: nn.Module | None) -> _Run:
        return _Run((kernels.DecodeLayer * len(descs))(*descs), mlp)

    def usable(self, x: torch.Tensor, meta: AttentionMetadata) -> bool:
        """This step can run here: a decode step whose tokens all have cache slots, tensors as the kernel reads
        them, no forward hooks on the layers (an alignment capture, a test's probe), nothing tracing, and the
        layers still holding the weights and caches the plan points into."""
        ctx = meta.ctx
        if (not ctx.is_decode or meta.slots is None or meta.slot_rows is not None or not kernels.ok(x)
                or x.dim() != 2 or not x.is_contiguous() or x.shape[1] != self.hidden):
            return False
        if (_module_hooks._global_forward_hooks or _module_hooks._global_forward_pre_hooks
                or any(m._forward_hooks or m._forward_pre_hooks for m in self.modules)
                or any(where.get(name) is not tensor for where, name, tensor in self._held)
                or (self.shm is not None and shm_allreduce.active() is not self.shm)):
            return False
        b = x.shape[0]
        cos, sin, slots, tables, seqlens = meta.cos, meta.sin, meta.slots, ctx.block_tables, ctx.seqlens_k
        return (cos is not None and cos.dtype == torch.float32 and cos.is_contiguous() and sin.is_contiguous()
                and cos.shape[0] == b and slots.dtype == torch.int64 and slots.is_contiguous() and slots.shape == (b,)
                and tables.dtype == torch.int32 and tables.is_contiguous() and tables.shape[0] == b
                and seqlens.dtype == torch.int32 and seqlens.is_contiguous() and tables.is_cpu and slots.is_cpu)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step through every layer: (the residual stream [B, hidden], the last MLP's output still to add to
        it). ``x`` is the step's own embedding output (updated in place). None when the kernel refused the
        shapes before the first layer (nothing written then; the caller runs the layers)."""
        delta, normed = torch.empty_like(x), torch.empty_like(x)
        has_delta = False
        ctx = meta.ctx
        for i, run in enumerate(self.runs):
            comm = self.shm.native_comm() if self.shm is not None else None
            rc = kernels.decode_layers(x, delta, has_delta, normed, run.layers, meta.cos, meta.sin, meta.slots,
                                       ctx.block_tables, ctx.seqlens_k, self.block_size, comm)
            if comm is not None:
                self.shm.native_done(comm, rc)  # its sequence number back; a failed collective raises here
            if rc == kernels.DECODE_REFUSED:
                if i == 0:
                    return None
                raise RuntimeError("the native decode refused a run of layers after the first")
            if run.mlp is not None:
                delta = run.mlp(normed).contiguous()  # [B, hidden]: the layer's own module (hooks and all)
            has_delta = True
        return x, delta
