"""How a parameter describes the checkpoint tensors it is made of and copies its rank's slice of each."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
from torch import nn

from agents.runtime.layers.quant import dequantizing

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


def check_shape(loaded: torch.Tensor, expected: Sequence[int]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise WeightShapeError(f"expected shape {tuple(expected)}, got {tuple(loaded.shape)}")


def adopt_or_copy(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Fill a whole parameter. A memory-mapped checkpoint tensor (marked ``_day0_mapped`` by the loader) of the
    same dtype, shape and device becomes the parameter's storage: no copy at all, the pages stay shared with
    the page cache (a private mapping, so a write to the weights never reaches the file)."""
    if (getattr(loaded, "_day0_mapped", False) and loaded.dtype == param.dtype and loaded.shape == param.shape
            and loaded.device == param.device and loaded.is_contiguous()):
        param.data = loaded
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
