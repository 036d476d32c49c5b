"""How a parameter describes the checkpoint tensors it is made of and copies its rank's slice of each."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Hashable, Sequence

import torch
from torch import nn

from agents.runtime.layers.quant import dequantizing

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_DONTNEED, MADV_HUGEPAGE = 4, 14
PAGE, HUGE_PAGE = 4096, 2 * 1024 * 1024

WeightLoader = Callable[[nn.Parameter, torch.Tensor, Hashable], None]


class WeightShapeError(ValueError):
    """A checkpoint tensor does not have the shape the parameter expects."""


def make_param(shape: Sequence[int], *, dtype: torch.dtype | None = None) -> nn.Parameter:
    """An uninitialised parameter (weights always come from a checkpoint, so no init cost)."""
    return nn.Parameter(torch.empty(tuple(shape), dtype=dtype), requires_grad=False)


def bind_loader(
    param: nn.Parameter,
    loader: WeightLoader,
    shards: Sequence[Hashable],
    shape_of: Callable[[Hashable], tuple[int, ...]],
) -> nn.Parameter:
    """Attach the loading protocol: ``weight_loader``, the shard ids it needs, each shard's checkpoint shape.
    The loader also takes a block-scaled FP8 checkpoint tensor, dequantised first (``layers/quant.py``)."""
    param.weight_loader = dequantizing(loader)
    param.shards = list(shards)
    param.checkpoint_shape = shape_of
    return param


def quantizable(param: nn.Parameter) -> nn.Parameter:
    """Mark a linear or expert weight that an FP8 checkpoint may store block-quantised (``layers/quant.py``)."""
    param.quantizable = True
    return param


def check_shape(loaded: torch.Tensor, expected: Sequence[int]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise WeightShapeError(f"expected shape {tuple(expected)}, got {tuple(loaded.shape)}")


def mapped_tensor(t: torch.Tensor) -> torch.Tensor:
    """Mark a zero-copy view of a mapped checkpoint (``loader``): ``adopt_or_copy`` may make it the parameter."""
    t._day0_mapped = True
    return t


def adopt_or_copy(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Fill a whole parameter. A memory-mapped checkpoint tensor (marked ``_day0_mapped`` by the loader) of the
    same dtype, shape and device becomes the parameter's storage: no copy at all, the pages stay shared with
    the page cache (a private mapping, so a write to the weights never reaches the file)."""
    if (getattr(loaded, "_day0_mapped", False) and loaded.dtype == param.dtype and loaded.shape == param.shape
            and loaded.device == param.device and loaded.is_contiguous()):
        param.data = loaded
        param.file_backed = True  # its pages are the checkpoint's: droppable, the page cache holds them
        loaded._day0_adopted = True
    else:
        param.data.copy_(loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: Hashable = None) -> None:
    """Whole tensor, same shape on every rank."""
    check_shape(loaded, param.shape)
    adopt_or_copy(param, loaded)


def replicated(param: nn.Parameter) -> nn.Parameter:
    full = tuple(param.shape)
    return bind_loader(param, default_weight_loader, [None], lambda _s: full)


def split(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(f"{what}={total} is not divisible by the parallel size {parts}")
    return total // parts


def column_major(param: nn.Parameter) -> bool:
    """Re-store a 2-D ``[out, in]`` weight column-major (an ``[in, out]`` buffer viewed transposed) when
    ``out >= in``. Batch-1 decode reads every weight once per token: MKL's matrix-vector product streams a
    column-major weight of these shapes at 1.3-1.9x the bandwidth of the row-major one (rows of only ``in``
    floats), and matrix products of larger batches run at the same speed either way. The old storage's
    file-backed pages are dropped from this process. True when the layout changed."""
    w = param.data
    out_features, in_features = w.shape if w.dim() == 2 else (0, 1)
    if (w.is_mkldnn or out_features < in_features or not w.is_floating_point() or w.device.type != "cpu"
            or w.stride(0) == 1):
        return False
    with torch.inference_mode(False), torch.no_grad():
        buf = torch.empty((in_features, out_features), dtype=w.dtype)  # buf: [in, out]
        _advise(buf, HUGE_PAGE, MADV_HUGEPAGE)  # before the first touch: fewer TLB misses while streaming
        buf.copy_(w.t())
        param.data = buf.t()  # [out, in] view, strides (1, out)
    if getattr(param, "file_backed", False) and w.is_contiguous():
        _advise(w, PAGE, MADV_DONTNEED)  # clean private file pages: a later read would refault the same bytes
        param.file_backed = False
    return True


def release_pages(t: torch.Tensor) -> None:
    """Drop contiguous ``t``'s clean private file pages from this process (a later read would refault them)."""
    _advise(t, PAGE, MADV_DONTNEED)


def _advise(t: torch.Tensor, unit: int, advice: int) -> None:
    """``madvise`` the whole ``unit``-aligned pages inside contiguous ``t``'s bytes (best effort)."""
    start = -(-t.data_ptr() // unit) * unit
    end = (t.data_ptr() + t.numel() * t.element_size()) // unit * unit
    if end > start:
        _libc.madvise(start, end - start, advice)
