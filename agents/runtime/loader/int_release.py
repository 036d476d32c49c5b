"""A release in an integer weight format (compressed-tensors pack-quantized INT4/INT8, GPTQ, AWQ; see
``layers/int_quant.py``), loaded strictly and emulated: the model is built unquantised from the config; every
checkpoint tensor is checked before anything is dequantised (a converted linear's packed codes, scales, zero
points and ``g_idx`` by name, shape and dtype; every other tensor as the unquantised loader would); then each
converted weight is dequantised at load into the runtime dtype and streamed into the model like a plain tensor.
The packed bytes live only while their weight is dequantised: the resident model takes the runtime dtype's bytes
(``quant.runtime_bytes``), not the file's (``quant.bytes``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from agents.runtime.layers.int_quant import IntFormat, check_g_idx, companions, dequantize_int, divisibility
from agents.runtime.layers.quant import quantizable_parameters
from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.hashing import ShardHasher, shard_rows
from agents.runtime.loader.safetensors_file import DTYPES, LoadError, MappedFile, TensorEntry
from agents.runtime.loader.validate import checkpoint_dtype, declared_tensors
from agents.runtime.models.registry import build_model


def converted_names(model: Any, fmt: IntFormat) -> set[str]:
    """The checkpoint names of the linear weights the format stores quantised: the runtime's quantisable 2-D
    weights (attention, MLP and expert linears; never embeddings, the LM head, norms or routers), less the
    config's ignore list."""
    name_of = model.mapping.checkpoint_name
    ids = quantizable_parameters(model)
    names = set()
    for param_name, param in model.named_parameters():
        if id(param) in ids:
            for shard in param.shards:
                name = name_of(param_name, shard)
                if len(param.checkpoint_shape(shard)) == 2 and fmt.converts(name):
                    names.add(name)
    return names


def load_int_release(model_dir: Path, config: dict[str, Any], fmt: IntFormat, *, dtype: torch.dtype,
                     device: str | torch.device = "cpu") -> tuple[Any, dict[str, Any]]:
    """(model, load report) of the integer-quantised release in ``model_dir``; LoadError naming the tensor and
    the format for anything the runtime cannot load."""
    t0 = time.perf_counter()
    plain_config = {k: v for k, v in config.items() if k != "quantization_config"}
    ckpt = Checkpoint.open(model_dir)
    hasher = ShardHasher(ckpt.files)
    try:
        model = build_model(plain_config, dtype=dtype, device=device)
    except (ValueError, NotImplementedError) as exc:
        raise LoadError(f"config.json: architecture {(config.get('architectures') or [None])[0]!r}: {exc}") from exc
    if not hasattr(model, "mapping"):
        raise LoadError(f"config.json: the {model.path} path cannot load {fmt.name} weights")
    declared = declared_tensors(model, plain_config)
    converted = converted_names(model, fmt)
    groups = _check(ckpt, declared, converted, fmt, checkpoint_dtype(config), model.is_ignored)
    packed = sum(e.nbytes for e in ckpt.tensors.values())

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        mapped = {path: MappedFile(path) for path in ckpt.files}
        try:
            for name, spec in declared.items():
                if model.is_ignored(name):
                    continue
                if name in groups:
                    out_features, in_features = spec.shape
                    parts = {suffix: mapped[e.file].tensor(e) for suffix, e in groups[name].items()}
                    yield name, dequantize_int(fmt, parts, out_features, in_features).to(dtype)
                else:
                    entry = ckpt.tensors[name]
                    yield name, mapped[entry.file].tensor(entry)
        finally:
            for source in mapped.values():
                source.close()

    try:
        model.load_weights(stream())
    except LoadError:
        raise
    except Exception as exc:
        raise LoadError(f"{fmt.name}: {exc}") from exc
    runtime = sum(p.numel() * p.element_size() for p in model.parameters())
    dtypes = Counter(e.dtype for e in ckpt.tensors.values())
    seconds = time.perf_counter() - t0
    report = {"ok": True, "path": model.path, "architecture": (config.get("architectures") or [None])[0],
              "dtype": str(dtype).removeprefix("torch."), "problems": [], "stats": {}, "tensors": len(ckpt.tensors),
              "fp8_tensors": 0, "bytes": packed, "seconds": round(seconds, 4),
              "gb_per_s": round(packed / seconds / 1e9, 3) if seconds > 0 else None,
              "shards": shard_rows(ckpt.files, hasher), "zero_copy_bytes": 0,
              "quant": {"format": fmt.method, "bits": fmt.bits, "group": fmt.group, "symmetric": fmt.symmetric,
                        "act_order": fmt.act_order, "converted": len(groups), "types": dict(sorted(dtypes.items())),
                        "mode": "emulated", "how": "dequantized at load", "bytes": packed, "runtime_bytes": runtime}}
    return model, report


def _check(ckpt: Checkpoint, declared: dict[str, Any], converted: set[str], fmt: IntFormat, config_dtype: str | None,
           ignored: Any) -> dict[str, dict[str, TensorEntry]]:
    """Every tensor's name, shape and dtype before any is read: per converted weight, its stored parts."""
    groups: dict[str, dict[str, TensorEntry]] = {}
    claimed: set[str] = set()
    for name in sorted(converted):
        out_features, in_features = declared[name].shape
        module = name.removesuffix(".weight")
        why = divisibility(fmt, out_features, in_features)
        if why:
            raise LoadError(f"{fmt.name}: {name!r} [{out_features}, {in_features}] cannot be stored in this "
                            f"format: {why}")
        if name in ckpt.tensors:
            raise LoadError(f"{ckpt.tensors[name].file.name}: tensor {name!r} is stored unquantised, but the "
                            f"{fmt.name} config converts it (expected {module}.{next(iter(companions(fmt, 8, 8)))})")
        parts: dict[str, TensorEntry] = {}
        for suffix, (shape, codes) in companions(fmt, out_features, in_features).items():
            full = f"{module}.{suffix}"
            entry = ckpt.tensors.get(full)
            if entry is None:
                raise LoadError(f"{ckpt.index_name}: {fmt.name}: missing tensor {full!r} of {name!r}")
            if tuple(entry.shape) != shape:
                raise LoadError(f"{entry.file.name}: {fmt.name}: tensor {full!r} has shape {list(entry.shape)}, "
                                f"expected {list(shape)} for weight [{out_features}, {in_features}]")
            if entry.dtype not in codes:
                raise LoadError(f"{entry.file.name}: {fmt.name}: tensor {full!r} has dtype {entry.dtype}, expected "
                                f"{' or '.join(codes)}")
            parts[suffix] = entry
        _check_values(fmt, parts, out_features, in_features)
        groups[name] = parts
        claimed |= {e.name for e in parts.values()}
    for name, entry in ckpt.tensors.items():
        if name in claimed:
            continue
        spec = declared.get(name)
        if spec is None:
            if not ignored(name):
                raise LoadError(f"{entry.file.name}: unexpected tensor {name!r} ({fmt.name}): the model has no "
                                f"parameter for it")
            continue
        if tuple(entry.shape) != tuple(spec.shape):
            raise LoadError(f"{entry.file.name}: tensor {name!r} has shape {list(entry.shape)}, the model expects "
                            f"{list(spec.shape)}")
        if not DTYPES[entry.dtype].is_floating_point or (config_dtype and entry.dtype not in (config_dtype, "F32")):
            raise LoadError(f"{entry.file.name}: tensor {name!r} has dtype {entry.dtype}, expected "
                            f"{config_dtype or 'a floating-point dtype'} (it is not converted by {fmt.name})")
    missing = sorted(n for n in set(declared) - set(ckpt.tensors) - set(groups) if not ignored(n))
    if missing:
        raise LoadError(f"{ckpt.index_name}: missing tensor {missing[0]!r}"
                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return groups


def _check_values(fmt: IntFormat, parts: dict[str, TensorEntry], out_features: int, in_features: int) -> None:
    """The small index tensors whose values decide the layout: compressed-tensors' ``weight_shape`` and GPTQ's
    ``g_idx`` (read here, a few bytes per weight)."""
    key = "weight_shape" if fmt.method == "compressed-tensors" else "g_idx" if fmt.method == "gptq" else None
    if key is None:
        return
    entry = parts[key]
    source = MappedFile(entry.file)
    try:
        values = source.tensor(entry).clone()
    finally:
        source.close()
    if key == "weight_shape" and values.tolist() != [out_features, in_features]:
        raise LoadError(f"{entry.file.name}: {fmt.name}: tensor {entry.name!r} says {values.tolist()}, the model's "
                        f"weight is [{out_features}, {in_features}]")
    why = check_g_idx(fmt, values, in_features) if key == "g_idx" else None
    if why:
        raise LoadError(f"{entry.file.name}: {fmt.name}: tensor {entry.name!r} {why}")



def dequantized_state(model_dir: Path, config: dict[str, Any], fmt: IntFormat) -> dict[str, torch.Tensor]:
    """The release's tensors by their unquantised names in fp32, converted weights dequantised: the align
    stage's reference (transformers on the same numbers) where transformers cannot load the format on CPU. Each
    converted weight's size comes from its parts (compressed-tensors' ``weight_shape``, GPTQ's and AWQ's packing);
    the load stage checks them against the model."""
    first = {"compressed-tensors": "weight_packed", "gptq": "qweight", "awq": "qweight"}[fmt.method]
    ckpt = Checkpoint.open(model_dir)
    mapped = {path: MappedFile(path) for path in ckpt.files}
    try:
        read = {name: mapped[e.file].tensor(e) for name, e in ckpt.tensors.items()}
        out: dict[str, torch.Tensor] = {}
        modules = {n.removesuffix(f".{first}") for n in read if n.endswith(f".{first}")}
        for module in sorted(modules):
            suffixes = companions(fmt, 8, 8)  # the names only
            parts = {s: read[f"{module}.{s}"] for s in suffixes if f"{module}.{s}" in read}
            packed = parts[first]
            if fmt.method == "compressed-tensors":
                out_features, in_features = (int(v) for v in parts["weight_shape"].tolist())
            elif fmt.method == "gptq":
                in_features, out_features = packed.shape[0] * 8, packed.shape[1]
            else:
                in_features, out_features = packed.shape[0], packed.shape[1] * 8
            out[f"{module}.weight"] = dequantize_int(fmt, parts, out_features, in_features)
            for suffix in suffixes:
                read.pop(f"{module}.{suffix}", None)
        out.update({name: t.float().clone() for name, t in read.items()})
        return out
    finally:
        for source in mapped.values():
            source.close()
