"""Capturing the aten operators a model calls: a ``TorchDispatchMode`` that counts every operator reaching the
dispatcher below autograd, with its input dtypes, the phases it appears in (prefill, decode) and meta copies of
its first call's arguments (the classifier re-runs the operator on them).

On the ``meta`` device data-dependent operators (``nonzero``, ``item``) cannot compute a value: they are
recorded, and a stand-in of the largest possible shape is returned so the trace continues — counts of such a
trace are an upper bound for data-dependent branches (MoE expert loops)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_aten = torch.ops.aten


@dataclass
class OpRecord:
    count: int = 0
    dtypes: set[str] = field(default_factory=set)
    phases: set[str] = field(default_factory=set)
    sample: tuple[tuple, dict] | None = None  # meta copies of the first call's arguments


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def _meta_stand_in(func: Any, args: tuple, kwargs: dict) -> Any:
    """A result for a data-dependent operator on meta tensors, or NotImplemented."""
    packet = func.overloadpacket
    if packet is _aten._local_scalar_dense:
        dtype = args[0].dtype
        return False if dtype == torch.bool else (0.0 if dtype.is_floating_point else 0)
    if packet is _aten.nonzero:
        x = args[0]
        return torch.empty((x.numel(), x.dim()), dtype=torch.long, device="meta")
    if packet is _aten.masked_select:
        return torch.empty((args[0].numel(),), dtype=args[0].dtype, device="meta")
    if packet is _aten.bincount:
        return torch.empty((int(kwargs.get("minlength", 0)) or args[0].numel(),), dtype=torch.long, device="meta")
    return NotImplemented


def _wrap_numbers(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Python numbers where the schema wants a Tensor, as 0-dim tensors: a composite kernel passes a wrapped
    number (``remainder.Scalar`` calls ``remainder.Tensor``) and the mode receives it unwrapped."""
    schema = func._schema.arguments
    out = list(args)
    for i, (value, arg) in enumerate(zip(args, schema, strict=False)):
        if isinstance(value, int | float | bool) and str(arg.type) == "Tensor":
            out[i] = torch.tensor(value)
    kw = {k: torch.tensor(v) if isinstance(v, int | float | bool) and any(
        a.name == k and str(a.type) == "Tensor" for a in schema) else v for k, v in kwargs.items()}
    return tuple(out), kw


class OperatorRecorder(TorchDispatchMode):
    """Counts every aten operator that reaches the dispatcher below autograd, per phase."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[Any, OpRecord] = {}
        self.phase = "prefill"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        record = self.ops.get(func)
        if record is None:
            record = self.ops[func] = OpRecord()
            record.sample = (tree_map(to_meta, args), tree_map(to_meta, kwargs))
        record.count += 1
        record.phases.add(self.phase)
        for leaf in tree_flatten((args, kwargs))[0]:
            if isinstance(leaf, torch.Tensor):
                record.dtypes.add(dtype_name(leaf.dtype))
        try:
            return func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as exc:
            if "Expected a value of type 'Tensor'" in str(exc):
                wrapped_args, wrapped_kwargs = _wrap_numbers(func, args, kwargs)
                return func(*wrapped_args, **wrapped_kwargs)
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            if not any(t.is_meta for t in tensors):
                raise
            if not all(t.is_meta for t in tensors):  # host-side layout tensors meet meta weights: move them over
                args, kwargs = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, (args, kwargs))
                return func(*args, **kwargs)
            stand_in = _meta_stand_in(func, args, kwargs)
            if stand_in is NotImplemented:
                raise
            return stand_in
