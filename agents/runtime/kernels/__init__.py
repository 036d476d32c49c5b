"""The runtime's fused fp32 CPU kernels (``csrc/``): RMSNorm, residual add + RMSNorm, SiLU-and-mul, in-place RoPE,
decode attention read straight from the paged KV cache, prefill attention of every prompt (or chunk) of a step over
that cache in one call, the greedy argmax of the logits, the routed SwiGLU experts of a MoE layer in one call, dense
linears over panel-packed weights, and a decode step through a run of decoder layers in one call
(``decode_layers``, on a tensor-parallel rank with the all-reduce of its partial sums inside); also the thread pinning and the shared-memory all-reduce the runtime's ranks use.

The C side is a header (``csrc/day0_kernels.h``) and one file per op family, compiled as one unit and loaded with
ctypes (``library``): a prebuilt library (``python -m agents.runtime.kernels build``) where one matches, else built
once per source, compiler and CPU flags into a cache (``build``). ``abi`` mirrors the header and refuses a library
whose ABI version or struct sizes differ. Where nothing loads, ``available()`` is False and every layer runs its
torch code, which is also the reference the kernels are tested against. The vectors are the CPU's own width (16
lanes with AVX-512, 8 with AVX2, 4 otherwise; ``status()`` says which); ``DAY0_KERNEL_CFLAGS`` adds compiler flags
(``-mno-avx512f`` builds the AVX2 code on an AVX-512 host). Each wrapper takes tensors the layers already hold and
says False/None when the case is not one it covers (dtype, device, layout), so the caller falls back.

Callers import this package (``from agents.runtime import kernels``) and use the names below; the modules are
``abi``, ``build``, ``library``, ``scratch`` and one per op family."""

from __future__ import annotations

from agents.runtime.kernels.abi import (
    COMM_ABANDONED,
    COMM_GONE,
    COMM_TIMEOUT,
    DECODE_DONE,
    DECODE_REFUSED,
    MAX_GROUP,
    MAX_HEAD_DIM,
    DecodeComm,
    DecodeLayer,
)
from agents.runtime.kernels.attention import paged_decode_attention, paged_prefill_attention
from agents.runtime.kernels.decode import decode_layers, decode_scratch
from agents.runtime.kernels.elementwise import add_rms_norm, argmax_rows, rms_norm, rotary_, silu_and_mul
from agents.runtime.kernels.experts import (
    expert_panel_shapes,
    moe_experts,
    moe_panels,
    pack_expert_panels,
    unpack_expert_panels,
)
from agents.runtime.kernels.library import available, ok, status
from agents.runtime.kernels.panels import PANEL, pack_panels, pack_panels_into, panel_linear
from agents.runtime.kernels.shm_allreduce import shm_allreduce
from agents.runtime.kernels.threads import bind_threads, one_thread_here

__all__ = [
    "COMM_ABANDONED", "COMM_GONE", "COMM_TIMEOUT", "DECODE_DONE", "DECODE_REFUSED", "MAX_GROUP", "MAX_HEAD_DIM",
    "PANEL", "DecodeComm", "DecodeLayer", "add_rms_norm", "argmax_rows", "available", "bind_threads",
    "decode_layers", "decode_scratch", "expert_panel_shapes", "moe_experts", "moe_panels", "ok", "one_thread_here",
    "pack_expert_panels", "pack_panels", "pack_panels_into",
    "paged_decode_attention", "paged_prefill_attention", "panel_linear", "rms_norm", "rotary_", "shm_allreduce",
    "silu_and_mul", "status", "unpack_expert_panels",
]
