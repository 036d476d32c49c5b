"""The loader's side of the registered quantised formats (``layers/quant_formats.py``): every stored part of every
quantised weight checked (present, shape, dtype) before any byte is copied, with errors naming the tensor and the
format; the parts of one weight streamed together as a ``QuantizedTensor``; and the load report's ``quant`` block.

Mode: the runtime dequantises these formats at load into its dtype (``how``), so it runs them ``emulated`` on
every device; ``device_has_type`` says whether the device itself has the format's element type (FP8 from
compute capability 8.9, FP4 from 10.0), i.e. whether a native kernel could run it there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from agents.runtime.layers.quant import TensorSpec
from agents.runtime.layers.quant_formats import QuantizedTensor, QuantSpec
from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.safetensors_file import LoadError, MappedFile, TensorEntry

Parts = dict[str, dict[str, TensorEntry]]  # logical weight -> role -> stored entry


def check_parts(ckpt: Checkpoint, declared: dict[str, TensorSpec]) -> Parts:
    """Each quantised weight's parts, checked; LoadError naming the tensor and the format otherwise."""
    out: Parts = {}
    for name, spec in declared.items():
        if spec.quant is None:
            continue
        q = spec.quant
        found: dict[str, TensorEntry] = {}
        plain = ckpt.tensors.get(name) if name not in q.part_names() else None
        if plain is not None:
            raise LoadError(f"{plain.file.name}: tensor {name!r} is stored unquantised ({plain.dtype}), but "
                            f"config.json declares it {q.format.label} (stored as "
                            f"{', '.join(repr(p.name) for p in q.parts if not p.optional)})")
        for part in q.parts:
            entry = ckpt.tensors.get(part.name)
            if entry is None:
                if part.optional:
                    continue
                raise LoadError(f"{ckpt.index_name}: {q.format.label} weight {name!r} lacks its tensor "
                                f"{part.name!r} ({part.what})")
            if entry.shape not in part.shapes:
                want = " or ".join(str(list(s)) for s in part.shapes)
                raise LoadError(f"{entry.file.name}: tensor {part.name!r} ({part.what}) has shape "
                                f"{list(entry.shape)}, expected {want} for {q.format.label} weight {name!r} "
                                f"{list(q.shape)}")
            if entry.dtype not in part.dtypes:
                raise LoadError(f"{entry.file.name}: tensor {part.name!r} ({part.what}) has dtype {entry.dtype}, "
                                f"expected {' or '.join(part.dtypes)}: the runtime cannot run it as "
                                f"{q.format.label}")
            found[part.role] = entry
        out[name] = found
    return out


def quantized_tensor(spec: QuantSpec, entries: dict[str, TensorEntry],
                     mapped: dict[Any, MappedFile]) -> QuantizedTensor:
    return QuantizedTensor(spec, {role: mapped[e.file].tensor(e) for role, e in entries.items()})


def release(entries: dict[str, TensorEntry], mapped: dict[Any, MappedFile]) -> int:
    """Drop the parts' pages after their weight is loaded; the bytes they held."""
    for e in entries.values():
        mapped[e.file].release(e.start, e.end)
    return sum(e.nbytes for e in entries.values())


def device_has_type(native_type: str, device: str | torch.device) -> bool | None:
    """Whether the device has the element type: None where unknown (CPU: no FP8/FP4 matmul units)."""
    device = torch.device(device)
    if device.type == "cpu":
        return False
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    need = {"float8_e4m3fn": (8, 9), "float4_e2m1fn": (10, 0)}.get(native_type)
    return None if need is None else (major, minor) >= need


def quant_report(parts: Parts, declared: dict[str, TensorSpec], dtype: torch.dtype,
                 device: str | torch.device) -> dict[str, Any]:
    """The load report's ``quant`` block: format, mode, how, the packed bytes (values + scales) and the bytes
    the dequantised weights take (``runtime_bytes``)."""
    if not parts:
        return {}
    formats = Counter(declared[name].quant.format.name for name in parts)
    fmt = declared[next(iter(parts))].quant.format
    element = torch.empty((), dtype=dtype).element_size()
    packed = sum(e.nbytes for entries in parts.values() for e in entries.values())
    runtime = sum(torch.Size(declared[name].shape).numel() * element for name in parts)
    return {"format": fmt.name if len(formats) == 1 else sorted(formats), "tensors": len(parts), "mode": "emulated",
            "how": f"dequantized at load to {str(dtype).removeprefix('torch.')} (computed in float32)",
            "bytes": packed, "runtime_bytes": runtime, "device_has_type": device_has_type(fmt.native_type, device),
            "parts": dict(sorted(Counter(e.dtype for v in parts.values() for e in v.values()).items()))}
