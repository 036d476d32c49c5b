"""Tensor-parallel linears: column (output split), row (input split, ``all_reduce`` in forward), merged
gate/up and packed QKV. Weights are ``[out_local, in_local]`` like ``nn.Linear``."""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from agents.runtime import kernels
from agents.runtime.distributed import all_reduce, get_tp_rank, get_tp_world_size
from agents.runtime.layers.fp8_native import fp8_linear, is_native
from agents.runtime.layers.weights import (
    adopt_or_copy,
    bind_loader,
    check_shape,
    make_param,
    quantizable,
    release_pages,
    replicated,
    split,
)

# oneDNN's matmul (the kernel torch.compile's CPU backend calls) runs fp32 GEMMs of 4+ rows 1.1-1.6x faster than
# MKL's on this AVX-512 host (MKL's path on AMD cores). For matrix-vector products (decode at batch 1) MKL's
# sgemv is single-threaded: with one thread it streams column-major weights fastest (see ``column_major``);
# with more threads oneDNN on row-major weights uses them all and reads 1.4-1.6x faster.
# Small weights (tiny models, routers) stay with MKL: a parallel region per call costs more than it saves there.
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
GEMM_MIN_ROWS = 4
ONEDNN_MIN_WEIGHT = 1 << 18  # elements (1 MiB of fp32); also the smallest weight ``pack_weight`` packs


# rows oneDNN lays a packed weight out for (its layout where the native kernels are not loaded). Quiet 2-core
# AVX-512 host, 2 threads, 576x1536 to 1536x576 weights: packed 1.4-2.3x faster than the plain layout at 2-16
# rows, 1.2-1.3x at 64, equal at one row.
PACK_BATCH_HINT = 16


def is_packed(weight: torch.Tensor) -> bool:
    """True for a weight ``pack_weight`` re-laid (oneDNN's blocked layout or the native kernels' panels)."""
    return weight.is_mkldnn or getattr(weight, "panel_rows", 0) > 0


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` for ``x: [T, in]``, ``weight: [out, in]`` (either memory layout, or packed by
    ``pack_weight``, or native FP8 with its row scales: ``fp8_native``)."""
    if is_native(weight):
        return fp8_linear(x, weight, bias)
    rows = getattr(weight, "panel_rows", 0)
    if rows:
        y = kernels.panel_linear(x, weight, rows, bias)
        return y if y is not None else _panels_torch(x, weight, rows, bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")  # [T, out]
    if _ONEDNN and weight.numel() >= ONEDNN_MIN_WEIGHT and x.dim() == 2 and x.dtype == torch.float32 and (
            x.device.type == "cpu") and (x.shape[0] >= GEMM_MIN_ROWS or (
            weight.stride(1) == 1 and torch.get_num_threads() > 1)):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")  # [T, out]
    return F.linear(x, weight, bias)


def _panels_torch(x: torch.Tensor, panels: torch.Tensor, rows: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``dense_linear`` over a panel-packed weight in torch ops (where the native kernel does not run: under a
    dispatch mode, which must see aten ops, or for inputs it does not cover)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.matmul(x2, panels)  # [P, T, 16]
    y = y.transpose(0, 1).reshape(x2.shape[0], -1)[:, :rows]  # [T, out]
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, rows)


def pack_layout() -> str:
    """The layout ``pack_weight`` uses: ``DAY0_PACK_LAYOUT`` (``panels`` or ``onednn``; for side-by-side
    measurements), else the native kernels' panels where they load and oneDNN's blocks otherwise."""
    asked = os.environ.get("DAY0_PACK_LAYOUT", "").strip().lower()
    if asked not in ("", "panels", "onednn"):
        raise ValueError(f"DAY0_PACK_LAYOUT={asked!r}: expected 'panels' or 'onednn'")
    if asked == "onednn" or not kernels.available():
        return "onednn"
    return "panels"


def pack_weight(module: nn.Module, name: str = "weight") -> bool:
    """Replace ``module.<name>`` (an fp32 ``[out, in]`` CPU weight) by the same values in a layout batched and
    unbatched products read fastest, never holding the model twice: the original's storage is freed and its
    file-backed pages dropped. Where the native kernels are loaded that is their panels (``kernels.pack_panels``,
    ``panel_rows`` = out on the parameter): each 16 outputs one contiguous stream, 1.5-2x the read rate of a
    matrix-vector product on the plain or oneDNN layout at 1-2 rows and oneDNN's own rate at 16 and more, every
    row's result independent of the batch. Otherwise oneDNN's blocked layout (``PACK_BATCH_HINT``), which skips
    its per-call weight reorder. The parameter keeps its loading attributes, but a packed weight is not
    reloaded: load first, then pack. True when packed."""
    param = getattr(module, name)
    w = param.data
    if (is_packed(w) or is_packed(param) or w.dim() != 2 or w.dtype != torch.float32 or w.device.type != "cpu"
            or w.numel() < ONEDNN_MIN_WEIGHT):
        return False
    with torch.inference_mode(False), torch.no_grad():
        panels = kernels.pack_panels(w if w.stride(1) == 1 else w.contiguous()) if pack_layout() == "panels" else None
        if panels is not None:
            packed = nn.Parameter(panels, requires_grad=False)
        elif _ONEDNN:
            packed = nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(w, PACK_BATCH_HINT), requires_grad=False)
        else:
            return False
    replace_packed(module, name, packed, w.shape[0] if panels is not None else 0)
    return True


def replace_packed(module: nn.Module, name: str, packed: nn.Parameter, panel_rows: int = 0) -> None:
    """Put ``packed`` (a re-laid copy of ``module.<name>``) in its place: the loading attributes carried over,
    ``panel_rows`` set for panels (``is_packed``: a reload is refused), the original's file pages dropped."""
    param = getattr(module, name)
    packed.__dict__.update({k: v for k, v in param.__dict__.items() if k != "file_backed"})
    if panel_rows:
        packed.panel_rows = panel_rows
    setattr(module, name, packed)
    if getattr(param, "file_backed", False) and param.data.is_contiguous():
        release_pages(param.data)


def native_rows(param: nn.Parameter) -> nn.Parameter:
    """A weight whose rows are never split (replicated, row-parallel): it may be held in native FP8, every
    checkpoint row in place (``fp8_native``)."""
    param.native_fp8 = True
    param.rows_of = lambda _shard_id: (0, 0, param.shape[0])
    return param


class ReplicatedLinear(nn.Module):
    """Full weight on every rank (routers, small projections)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = native_rows(quantizable(replicated(make_param((out_features, in_features)))))
        self.bias = replicated(make_param((out_features,))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if is_native(self.weight):
            return fp8_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T`` with W's rows (outputs) split over TP ranks; the output stays sharded."""

    def __init__(self, in_features: int, output_sizes: Sequence[int], bias: bool = False) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.in_features = in_features
        self.output_sizes = list(output_sizes)
        self.local_sizes = [split(s, self.tp_size, "output size") for s in self.output_sizes]
        out_local = sum(self.local_sizes)
        self.weight = quantizable(self._bind(make_param((out_local, in_features)), with_input=True))
        self.bias = self._bind(make_param((out_local,)), with_input=False) if bias else None

    def shard_ids(self) -> list[Hashable]:
        return [None] if len(self.output_sizes) == 1 else list(range(len(self.output_sizes)))

    def shard_layout(self, shard_id: Hashable) -> tuple[int, int, int]:
        """(checkpoint rows, destination offset, rows taken) for one shard on this rank."""
        index = 0 if shard_id is None else int(shard_id)
        offset = sum(self.local_sizes[:index])
        return self.output_sizes[index], offset, self.local_sizes[index]

    def source_start(self, shard_id: Hashable) -> int:
        return self.tp_rank * self.shard_layout(shard_id)[2]

    def _bind(self, param: nn.Parameter, with_input: bool) -> nn.Parameter:
        tail = (self.in_features,) if with_input else ()

        def shape_of(shard_id: Hashable) -> tuple[int, ...]:
            return (self.shard_layout(shard_id)[0], *tail)

        def load(p: nn.Parameter, loaded: torch.Tensor, shard_id: Hashable = None) -> None:
            check_shape(loaded, shape_of(shard_id))
            _, offset, rows = self.shard_layout(shard_id)
            if rows == p.shape[0] and rows == loaded.shape[0]:  # the whole parameter: no slicing needed
                adopt_or_copy(p, loaded)
                return
            p.data.narrow(0, offset, rows).copy_(loaded.narrow(0, self.source_start(shard_id), rows))

        def target(p: nn.Parameter, shard_id: Hashable) -> torch.Tensor | None:
            """Where a whole shard of a merged parameter goes unchanged (``loader/direct.py``); None for a TP
            slice or a shard that is the whole parameter (adopted, zero-copy)."""
            rows, offset, taken = self.shard_layout(shard_id)
            if rows != taken or rows == p.shape[0]:
                return None
            return p.data.narrow(0, offset, rows)

        param.concatenates_shards = self.concatenates_shards
        param.direct_target = target
        if with_input:  # the rows a shard fills (offset here, start in the checkpoint, count): FP8 row scales
            param.native_fp8 = True
            param.rows_of = lambda shard_id: (self.shard_layout(shard_id)[1], self.source_start(shard_id),
                                              self.shard_layout(shard_id)[2])
        return bind_loader(param, load, self.shard_ids(), shape_of)

    def concatenates_shards(self) -> bool:
        """True when the parameter is exactly its checkpoint shards stacked whole, in ``shard_ids`` order (no TP
        slice): the loader may then adopt one run of the file holding them back to back (``loader/__init__``)."""
        offset = 0
        for shard_id in self.shard_ids():
            rows, at, taken = self.shard_layout(shard_id)
            if rows != taken or at != offset or self.source_start(shard_id) != 0:
                return False
            offset += taken
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up: shard ids 0 and 1)."""


class QKVParallelLinear(ColumnParallelLinear):
    """Packed q/k/v projection (shard ids "q", "k", "v"). KV heads are split over TP ranks, or replicated
    when there are fewer KV heads than ranks."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False) -> None:
        tp = get_tp_world_size()
        self.num_heads = split(num_heads, tp, "num_attention_heads") if num_heads else 0
        if num_kv_heads >= tp:
            self.num_kv_heads = split(num_kv_heads, tp, "num_key_value_heads")
        else:
            if tp % num_kv_heads:
                raise ValueError(f"num_key_value_heads={num_kv_heads} does not divide the TP size {tp}")
            self.num_kv_heads = 1
        self.head_dim = head_dim
        self.kv_replicas = max(1, tp // num_kv_heads)
        self.total_sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        super().__init__(hidden, [self.num_heads * head_dim * tp] + [self.num_kv_heads * head_dim * tp] * 2, bias)
        self.output_sizes = self.total_sizes

    def shard_ids(self) -> list[Hashable]:
        return ["q", "k", "v"]

    def shard_layout(self, shard_id: Hashable) -> tuple[int, int, int]:
        index = {"q": 0, "k": 1, "v": 2}[shard_id]
        return self.total_sizes[index], sum(self.local_sizes[:index]), self.local_sizes[index]

    def source_start(self, shard_id: Hashable) -> int:
        rows = self.shard_layout(shard_id)[2]
        rank = self.tp_rank if shard_id == "q" else self.tp_rank // self.kv_replicas
        return rank * rows


class RowParallelLinear(nn.Module):
    """``y = x W^T`` with W's columns (inputs) split over TP ranks; partial outputs summed by ``all_reduce``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, reduce_results: bool = True) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.in_local = split(in_features, self.tp_size, "input size")
        self.reduce_results = reduce_results
        full = (out_features, in_features)

        def load(p: nn.Parameter, loaded: torch.Tensor, shard_id: Hashable = None) -> None:
            check_shape(loaded, full)
            if self.tp_size == 1:
                adopt_or_copy(p, loaded)
            else:
                p.data.copy_(loaded.narrow(1, self.tp_rank * self.in_local, self.in_local))

        self.weight = native_rows(quantizable(bind_loader(make_param((out_features, self.in_local)), load, [None],
                                                          lambda _s: full)))
        self.bias = replicated(make_param((out_features,))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = dense_linear(x, self.weight)  # y: [T, out] partial sum over this rank's inputs
        if self.reduce_results and self.tp_size > 1:
            y = all_reduce(y)
        return y if self.bias is None else y + self.bias
