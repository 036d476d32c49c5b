"""A GGUF release loaded directly (``model_dir`` holds one ``*.gguf`` and no safetensors): the config comes from
the file's metadata (``transformers``' GGUF reader), every tensor is checked (name, shape, GGUF type) against what
the runtime model declares before any is dequantised, then each is dequantised with the ``gguf`` package's own
``gguf.quants.dequantize`` into the runtime dtype and streamed into the model: emulated, dequantised at load, so
the model takes its runtime dtype's bytes, not the file's. Names follow llama.cpp's llama layout, whose converter
permutes the rows of ``attn_q``/``attn_k`` for its rope; the loader undoes that permutation."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.runtime.loader.hashing import ShardHasher, shard_rows
from agents.runtime.loader.safetensors_file import LoadError

# the GGUF types this loader dequantises (the gguf package knows more; these are the ones tested here)
SUPPORTED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM"}
GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}
BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
         "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
BLOCK_NAME = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def gguf_file(model_dir: Path) -> Path | None:
    """The GGUF a directory is released as: exactly one ``*.gguf`` and no safetensors; None otherwise."""
    files = sorted(model_dir.glob("*.gguf"))
    if not files or any(model_dir.glob("*.safetensors")):
        return None
    if len(files) > 1:
        raise LoadError(f"{model_dir}: {len(files)} GGUF files ({', '.join(f.name for f in files)}); "
                        f"a release directory holds one")
    return files[0]


def hf_name(name: str) -> str | None:
    """The runtime's checkpoint name of a llama-layout GGUF tensor; None for a name outside that layout."""
    if name in GLOBAL:
        return GLOBAL[name]
    match = BLOCK_NAME.match(name)
    if match and match.group(2) in BLOCK:
        return f"model.layers.{match.group(1)}.{BLOCK[match.group(2)]}.{match.group(3)}"
    return None


def unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's rope permutation of q/k rows: [heads, 2, half, in] was stored as [heads, half, 2, in]."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def read_config(path: Path, architecture: str) -> dict[str, Any]:
    """The HF config the GGUF's metadata describes (its ``quantization_config`` marker dropped: the loader
    dequantises, the model is built unquantised)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds on a bad file
        raise LoadError(f"{path.name}: unreadable GGUF metadata: {exc}") from exc
    config.pop("quantization_config", None)
    config["architectures"] = config.get("architectures") or [architecture]
    return config


def gguf_files_kwargs(model_dir: Path | None) -> dict[str, str]:
    """``{"gguf_file": name}`` for transformers' ``from_pretrained`` when ``model_dir`` is a GGUF release."""
    path = gguf_file(model_dir) if model_dir is not None and not (model_dir / "config.json").exists() else None
    return {"gguf_file": path.name} if path is not None else {}


def release_config(model_dir: Path) -> dict[str, Any] | None:
    """The config a job plans and aligns a GGUF-only release with (None when ``model_dir`` is not one): the HF
    config from its metadata, plus ``quantization_config: {quant_method: "gguf", type, types}`` where ``type``
    is the GGUF type holding the most 2-D weights' values (the planner counts that format's bytes) and ``types``
    counts every tensor's type. LoadError for an unreadable file or an architecture the runtime lacks."""

    if (model_dir / "config.json").exists():
        return None
    path = gguf_file(model_dir)
    if path is None:
        return None
    reader, arch, config = _open(path)
    values: Counter[str] = Counter()
    for tensor in reader.tensors:
        if len(tensor.shape) == 2:
            values[tensor.tensor_type.name] += int(tensor.n_elements)
    types = Counter(t.tensor_type.name for t in reader.tensors)
    dominant = values.most_common(1)[0][0].lower() if values else "float32"
    config["quantization_config"] = {"quant_method": "gguf", "type": dominant, "types": dict(sorted(types.items()))}
    return config


def _open(path: Path) -> tuple[Any, str, dict]:
    """(reader, architecture, config) of a GGUF file of a supported architecture; LoadError naming the file otherwise."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise LoadError(f"{path.name}: not a readable GGUF file: {exc}") from exc
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode() if arch_field else None
    if arch not in GGUF_ARCHITECTURES:
        raise LoadError(f"{path.name}: GGUF architecture {arch!r} is not supported (supported: "
                        f"{', '.join(GGUF_ARCHITECTURES)})")
    return reader, arch, read_config(path, GGUF_ARCHITECTURES[arch])


def load_gguf(path: Path, *, dtype: torch.dtype, device: str | torch.device = "cpu") -> tuple[Any, dict, dict]:
    """(model, load report, config) of the GGUF release at ``path``; LoadError naming the tensor and the format
    for a name, shape or quantisation type the runtime cannot load."""
    import gguf

    from agents.runtime.loader.validate import declared_tensors
    from agents.runtime.models.registry import build_model

    t0 = time.perf_counter()
    reader, arch, config = _open(path)
    model = build_model(config, dtype=dtype, device=device)
    declared = declared_tensors(model, config)
    heads = {"attn_q": config["num_attention_heads"],
             "attn_k": config.get("num_key_value_heads") or config["num_attention_heads"]}
    plan: list[tuple[str, Any]] = []
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        name = hf_name(tensor.name)
        if name is None or name not in declared:
            raise LoadError(f"{path.name}: tensor {tensor.name!r} (GGUF {kind}) is not a tensor of the runtime's "
                            f"{GGUF_ARCHITECTURES[arch]} (as {name!r})")
        if kind not in SUPPORTED:
            raise LoadError(f"{path.name}: tensor {tensor.name!r} is stored as GGUF {kind}, which the runtime "
                            f"cannot dequantise (supported: {', '.join(SUPPORTED)})")
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists the fastest dimension first
        if shape != tuple(declared[name].shape):
            raise LoadError(f"{path.name}: tensor {tensor.name!r} (GGUF {kind}) has shape {list(shape)}, the "
                            f"runtime expects {list(declared[name].shape)} for {name!r}")
        plan.append((name, tensor))
    missing = sorted(set(declared) - {name for name, _ in plan})
    if missing:
        raise LoadError(f"{path.name}: the GGUF lacks {len(missing)} tensor(s) the model needs, e.g. {missing[0]!r}")

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in plan:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # fp32, [rows, cols]
            weight = torch.from_numpy(np.array(values, dtype=np.float32)).reshape(declared[name].shape)
            part = tensor.name.split(".")[-2] if tensor.name.startswith("blk.") else ""
            if part in heads:
                weight = unpermute(weight, heads[part])
            yield name, weight.to(dtype)

    hasher = ShardHasher([path])
    model.load_weights(stream())
    seconds = time.perf_counter() - t0
    types = Counter(t.tensor_type.name for _, t in plan)
    packed = sum(int(t.n_bytes) for _, t in plan)
    element = torch.empty((), dtype=dtype).element_size()
    runtime = sum(int(np.prod(t.shape)) * element for _, t in plan)
    report = {"ok": True, "path": model.path, "architecture": GGUF_ARCHITECTURES[arch],
              "dtype": str(dtype).removeprefix("torch."), "problems": [], "stats": {}, "tensors": len(plan),
              "fp8_tensors": 0, "bytes": path.stat().st_size, "seconds": round(seconds, 4),
              "gb_per_s": round(path.stat().st_size / seconds / 1e9, 3) if seconds > 0 else None,
              "shards": shard_rows([path], hasher), "zero_copy_bytes": 0,
              "quant": {"format": "gguf", "types": dict(sorted(types.items())), "mode": "emulated",
                        "how": "dequantized at load", "bytes": packed, "runtime_bytes": runtime}}
    return model, report, config
