"""Checks before any byte is copied: every checkpoint name, shape and dtype against what the model declares
(``checkpoint_tensors``: the config's dtype or F32, or block-scaled FP8 with its ``_scale_inv`` companion). Errors
name the file and the tensor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agents.runtime.layers.quant import FP8_CODES, ScaleSpec, TensorSpec, block_fp8_format
from agents.runtime.layers.quant_formats import quant_format
from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.safetensors_file import DTYPES, NAMES, LoadError, TensorEntry


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
    if name not in table:
        raise ValueError(f"unsupported dtype {name!r} (use float32, bfloat16 or float16)")
    return table[name]


def checkpoint_dtype(config: dict[str, Any]) -> str | None:
    """The safetensors dtype code the config declares for the weights, if it declares one."""
    name = config.get("torch_dtype") or config.get("dtype")
    if not name:
        return None
    try:
        return NAMES[torch_dtype(name)]
    except ValueError:
        return None


def declared_tensors(model: Any, config: dict[str, Any]) -> dict[str, TensorSpec]:
    """What the model accepts per checkpoint name: its own declaration (``checkpoint_tensors``), else its
    ``expected_tensors`` shapes with unquantised storage only."""
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    try:
        registered = quant_format(config)
    except ValueError as exc:
        raise LoadError(f"config.json: {exc}") from exc
    if quant and str(method).lower() != "fp8" and registered is None:
        raise LoadError(f"config.json: quantization_config.quant_method {method!r} is not supported (the runtime "
                        f"loads unquantised, block-scaled fp8, MXFP4, NVFP4, FP8 per-tensor/per-channel, "
                        f"compressed-tensors pack-quantized INT4/INT8, GPTQ, AWQ and GGUF releases)")
    try:
        if hasattr(model, "checkpoint_tensors"):
            return model.checkpoint_tensors()
    except ValueError as exc:
        raise LoadError(f"config.json: {exc}") from exc
    if block_fp8_format(config) is not None or registered is not None:
        what = "FP8-quantised" if registered is None else f"quantised as {registered.label}"
        raise LoadError(f"config.json: the checkpoint is {what}, which the {model.path} path of "
                        f"{(config.get('architectures') or [None])[0]!r} cannot load")
    return {name: TensorSpec(tuple(shape)) for name, (shape, _) in model.expected_tensors().items()}


def validate(ckpt: Checkpoint, declared: dict[str, TensorSpec], is_ignored: Callable[[str], bool] | None,
              config: dict[str, Any]) -> dict[str, TensorEntry]:
    """Every name, shape and dtype checked before any copy: errors name the file and the tensor. Returns each
    FP8 weight's scale entry."""
    scale_of = {spec.fp8.name: name for name, spec in declared.items() if spec.fp8 is not None}
    for spec in declared.values():  # a registered format's parts are checked by ``quantized.check_parts``
        if spec.quant is not None:
            scale_of.update(dict.fromkeys(spec.quant.part_names(), spec.quant.name))
    config_dtype = checkpoint_dtype(config)
    scales: dict[str, TensorEntry] = {}
    # scale-like names last: an FP8 tensor the model does not take is the clearer error than its stray scale
    for name, entry in sorted(ckpt.tensors.items(), key=lambda item: item[0].endswith("_scale_inv")):
        if name in scale_of:
            continue  # checked with its weight
        spec = declared.get(name)
        if spec is not None and spec.quant is not None:
            continue  # declared in a registered format: ``quantized.check_parts`` checks it
        if spec is None:
            if is_ignored is not None and not is_ignored(name):
                raise LoadError(f"{entry.file.name}: unexpected tensor {name!r}: the model has no parameter for it")
            continue
        if entry.shape != spec.shape:
            raise LoadError(f"{entry.file.name}: tensor {name!r} has shape {list(entry.shape)}, "
                            f"the model expects {list(spec.shape)}")
        if entry.dtype in FP8_CODES and spec.fp8 is not None:
            scales[name] = _check_scale(ckpt, entry, spec.fp8)
        elif not DTYPES[entry.dtype].is_floating_point or entry.dtype in FP8_CODES or (
                config_dtype and entry.dtype not in (config_dtype, "F32")):
            # The declared dtype, or F32 (kept in full precision, e.g. routing biases in bf16 checkpoints).
            want = f"{config_dtype} (the config's dtype) or F32" if config_dtype else "a floating-point dtype"
            if spec.fp8 is not None:
                want += f", or {FP8_CODES[0]} with a {spec.fp8.name!r} scale"
            elif entry.dtype in FP8_CODES:
                want += " (the model expects no FP8 tensor here"
                want += ")" if block_fp8_format(config) else ": config.json has no fp8 quantization_config)"
            raise LoadError(f"{entry.file.name}: tensor {name!r} has dtype {entry.dtype}, expected {want}")
    for scale_name, weight in scale_of.items():
        if declared[weight].quant is not None:
            continue
        if scale_name in ckpt.tensors and weight in ckpt.tensors and weight not in scales:
            raise LoadError(f"{ckpt.tensors[scale_name].file.name}: scale tensor {scale_name!r} accompanies "
                            f"{weight!r}, which is stored as {ckpt.tensors[weight].dtype}, not FP8")
    missing = sorted({n for n, spec in declared.items() if spec.quant is None} - set(ckpt.tensors))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise LoadError(f"{ckpt.index_name}: missing tensor {missing[0]!r}{more}")
    return scales


def _check_scale(ckpt: Checkpoint, weight: TensorEntry, spec: ScaleSpec) -> TensorEntry:
    scale = ckpt.tensors.get(spec.name)
    if scale is None:
        raise LoadError(f"{weight.file.name}: FP8 tensor {weight.name!r} has no scale tensor {spec.name!r} "
                        f"in the checkpoint")
    if scale.shape != spec.shape:
        raise LoadError(f"{scale.file.name}: scale tensor {spec.name!r} has shape {list(scale.shape)}, expected "
                        f"{list(spec.shape)} ({spec.block[0]}×{spec.block[1]} blocks of {weight.name!r} "
                        f"{list(weight.shape)})")
    if scale.dtype not in spec.dtypes:
        raise LoadError(f"{scale.file.name}: scale tensor {spec.name!r} has dtype {scale.dtype}, expected one of "
                        f"{', '.join(spec.dtypes)}")
    return scale
