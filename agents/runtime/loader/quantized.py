"""The loader's side of the registered quantised formats (``layers/quant_formats.py``): every stored part of every
quantised weight checked (present, shape, dtype) before any byte is copied, with errors naming the tensor and the
format; the parts of one weight streamed together as a ``QuantizedTensor``; and the load report's ``quant`` block.

Mode (``--quant-mode``, ``fp8_native.mode_for``): FP8 per tensor / per channel may run ``native`` (weights kept
in FP8 with row scales, ``torch._scaled_mm`` W8A8: ``prepare_native``); every other format, and FP8 under
``emulated``, is dequantised at load into the runtime dtype (``how``). ``device_has_type`` says whether the
device itself has the format's element type (FP8 from compute capability 8.9, FP4 from 10.0).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from agents.runtime.layers import fp8_native
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


def prepare_native(model: Any, parts: Parts, declared: dict[str, TensorSpec], asked: str,
                   hardware_declares: bool | None, device: str | torch.device) -> tuple[str, set[str]]:
    """Choose the mode (``fp8_native.mode_for``; ValueError for a forced ``native`` without a native path) and,
    when native, turn every linear weight whose checkpoint tensors are all FP8 per tensor/channel into FP8
    storage with row scales before loading; (mode, the checkpoint names loaded natively)."""
    fmt = declared[next(iter(parts))].quant.format if parts else None
    mode = fp8_native.mode_for(fmt.name if fmt else None, asked, hardware_declares,
                               device_has_type(fmt.native_type, device) if fmt else None)
    native: set[str] = set()
    name_of = getattr(getattr(model, "mapping", None), "checkpoint_name", None)
    if mode != "native" or name_of is None:
        return mode, native
    for param_name, param in model.named_parameters():
        names = [name_of(param_name, shard) for shard in getattr(param, "shards", [])]
        if (fp8_native.native_param(param) and names and all(
                n in parts and declared[n].quant.format.name in fp8_native.RUNTIME_NATIVE for n in names)):
            fp8_native.convert(param)
            native.update(names)
    return mode, native


def quant_report(parts: Parts, declared: dict[str, TensorSpec], dtype: torch.dtype,
                 device: str | torch.device, model: Any = None, native: set[str] = frozenset()) -> dict[str, Any]:
    """The load report's ``quant`` block: format, mode, how, the packed bytes (values + scales) and the bytes
    the weights take as loaded (``runtime_bytes``: FP8 values + fp32 row scales where native, the runtime
    dtype's where dequantised)."""
    if not parts:
        return {}
    formats = Counter(declared[name].quant.format.name for name in parts)
    fmt = declared[next(iter(parts))].quant.format
    element = torch.empty((), dtype=dtype).element_size()
    packed = sum(e.nbytes for entries in parts.values() for e in entries.values())
    emulated = [name for name in parts if name not in native]
    runtime = sum(torch.Size(declared[name].shape).numel() * element for name in emulated)
    dtype_name = str(dtype).removeprefix("torch.")
    out = {"format": fmt.name if len(formats) == 1 else sorted(formats), "tensors": len(parts),
           "mode": "native" if native else "emulated",
           "how": f"dequantized at load to {dtype_name} (computed in float32)",
           "bytes": packed, "runtime_bytes": runtime, "device_has_type": device_has_type(fmt.native_type, device),
           "parts": dict(sorted(Counter(e.dtype for v in parts.values() for e in v.values()).items()))}
    if native:
        out["runtime_bytes"] += fp8_native.runtime_bytes(model)
        out["how"] = (f"float8_e4m3fn weights with fp32 row scales, torch._scaled_mm W8A8 (activations quantized "
                      f"per token to e4m3), out {dtype_name}")
        out["native_tensors"] = len(native)
        if emulated:  # weights no native layer holds (fused experts, MLA's kv_b_proj)
            out["emulated_tensors"] = sorted(emulated)[:20]
            out["how"] += f"; {len(emulated)} tensors dequantized at load to {dtype_name}"
    return out
