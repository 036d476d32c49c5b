"""The registry of quantised weight formats a checkpoint may store its linear weights in (beside the block FP8 of
``quant.py``, which predates it and keeps its own path).

A format module (``quant_float.py``: MXFP4, NVFP4, FP8 per tensor / per channel; integer formats in their own
modules) defines a ``QuantFormat`` and registers a parser with ``@register``: given a ``quantization_config`` it returns the
format the config's ``quantization_config`` declares, None when the config is not its business, or raises
``ValueError`` (a sentence naming the key) for a layout it recognises but the runtime cannot run.

Per logical weight (the name and shape the unquantised checkpoint would have, e.g. ``...q_proj.weight`` [out, in])
a format lists its stored ``parts`` (``PartSpec``: checkpoint name, accepted shapes and dtypes, what it holds).
The loader (``loader/quantized.py``) checks every part before any byte is copied, streams the parts of one weight
together as a ``QuantizedTensor``, and the parameter's weight loader (``quant.dequantizing``) dequantises it into
the runtime dtype, computed in fp32 (emulated: dequantised at load), then slices it for TP like a plain tensor.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class PartSpec:
    """One stored tensor of a quantised weight."""

    role: str  # "values", "scale", "global_scale", "input_scale", "zero_point", ...
    name: str  # its checkpoint name
    shapes: tuple[tuple[int, ...], ...]  # accepted shapes (a scalar scale may be stored as [] or [1])
    dtypes: tuple[str, ...]  # accepted safetensors dtype codes
    what: str  # what it holds, for error messages ("e8m0 scale per 32 values")
    optional: bool = False  # may be absent (activation scales a weight-only runtime does not use)


@dataclass(frozen=True)
class QuantSpec:
    """How one logical weight is stored in a quantised checkpoint: its format and parts (the first is the
    packed values)."""

    format: QuantFormat
    name: str  # the logical weight's name
    shape: tuple[int, ...]  # its dequantised shape
    parts: tuple[PartSpec, ...]

    def part_names(self) -> set[str]:
        return {p.name for p in self.parts}


class QuantFormat:
    """A quantised storage format. Subclasses set ``name`` (the planner's canonical name, ``contract/planner/
    formats.py``), ``label`` (for sentences) and implement ``parts`` and ``dequantize``."""

    name = ""
    label = ""
    # the element type a device must have to run the format natively (``formats.NATIVE_TYPE``)
    native_type = ""

    def __init__(self, not_converted: tuple[str, ...] = ()) -> None:
        self.not_converted = tuple(m.strip(".") for m in not_converted)

    def converts(self, name: str) -> bool:
        """Whether the checkpoint stores this (quantisable) weight quantised: not under an excluded module
        (``modules_to_not_convert`` / ``ignore`` / ``exclude_modules``, dotted prefixes or ``*`` globs)."""
        module = name.removesuffix(".weight")
        return not any(_matches(pattern, module) for pattern in self.not_converted)

    def spec(self, name: str, shape: tuple[int, ...]) -> QuantSpec:
        return QuantSpec(self, name, tuple(shape), self.parts(name, tuple(shape)))

    def parts(self, name: str, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        raise NotImplementedError

    def dequantize(self, parts: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
        """The weight in fp32 from its parts (by role), ``shape``."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"format": self.name}


def _matches(pattern: str, module: str) -> bool:
    if pattern.startswith("re:"):  # compressed-tensors' regex form
        return re.match(pattern[3:], module) is not None
    if "*" in pattern:
        return fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*")
    dotted = f".{module}."
    return f".{pattern}." in dotted


@dataclass
class QuantizedTensor:
    """The stored parts of one quantised weight, streamed together; weight loaders call ``dequantize``."""

    spec: QuantSpec
    parts: dict[str, torch.Tensor]  # by role
    dequantized: torch.Tensor | None = field(default=None, repr=False)  # the last result, for the loader's stats

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.spec.shape)

    def dequantize(self, dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
        """The weight in ``dtype`` on ``device`` (the packed parts travel, not the dequantised values)."""
        parts = self.parts if device is None else {r: t.to(device) for r, t in self.parts.items()}
        self.dequantized = self.spec.format.dequantize(parts, self.spec.shape).to(dtype)
        return self.dequantized


Parser = Callable[[dict[str, Any]], QuantFormat | None]
PARSERS: list[Parser] = []


def register(parser: Parser) -> Parser:
    """Add a config parser to the registry (module import time)."""
    PARSERS.append(parser)
    return parser


def quant_format(config: dict[str, Any]) -> QuantFormat | None:
    """The registered format the config's ``quantization_config`` declares; None when no parser takes it.
    ValueError (naming the key) for a layout a parser recognises but the runtime cannot run."""
    quant = config.get("quantization_config")
    if not quant:
        return None
    if not isinstance(quant, dict):
        raise ValueError("quantization_config must be an object")
    for parser in PARSERS:
        fmt = parser(quant)
        if fmt is not None:
            return fmt
    return None
