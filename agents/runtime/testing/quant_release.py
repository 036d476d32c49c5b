"""Quantised test releases (``day0 make-model --quant FORMAT``): a random-weight test model (``make_model``) kept
unquantised under ``original/`` (the quality-cost comparison's original) and, beside it in the output directory,
the same weights quantised in FORMAT as the format's published checkpoints store them (``layers/quant_float.py``).

Which weights are quantised is what the runtime declares for the config (its linear and expert weights; the
embeddings, LM head, norms and routers stay unquantised), so the release is exactly what the loader accepts.
FP8 per tensor / per channel is quantised by the ``compressed-tensors`` library (its ``calculate_qparams`` and
``quantize``, its ``QuantizationConfig`` written as the config); MXFP4 and NVFP4 have no quantiser on PyPI that
runs on a CPU, so they are written here from their specifications (OCP Microscaling Formats v1.0 §5-6; NVIDIA
modelopt's NVFP4: E2M1 with an E4M3 scale per 16 and a global fp32 scale). Everything is deterministic.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from agents.runtime.layers.quant_float import E2M1
from agents.runtime.layers.quant_formats import QuantSpec, quant_format
from agents.runtime.models.registry import build_model
from agents.runtime.testing.int_models import INT_ARCHES, INT_WRITERS
from agents.runtime.testing.make_model import make_model

QUANT_CHOICES = ("mxfp4", "nvfp4", "fp8-tensor", "fp8-channel")
ORIGINAL = "original"
FP8_MAX = 448.0  # largest float8_e4m3fn
FP4_MAX = 6.0  # largest E2M1


def quant_config(fmt: str) -> dict[str, Any]:
    """The ``quantization_config`` a published release of ``fmt`` carries."""
    if fmt == "mxfp4":  # gpt-oss's (its attention and router stay bf16 there; here every linear is quantised)
        return {"quant_method": "mxfp4", "modules_to_not_convert": ["model.embed_tokens", "lm_head"]}
    if fmt == "nvfp4":  # modelopt's, as NVIDIA's *-FP4 releases carry it in config.json
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                "exclude_modules": ["lm_head"]}
    if fmt in ("fp8-tensor", "fp8-channel"):
        from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme

        scheme = QuantizationScheme(targets=["Linear"], weights=_fp8_args(fmt))
        config = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized",
                                    ignore=["lm_head"], quantization_status="compressed")
        return config.model_dump(exclude_none=True)
    raise ValueError(f"unknown quantised format {fmt!r} (choose from {', '.join(QUANT_CHOICES)})")


def _fp8_args(fmt: str) -> Any:
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=8, type="float", strategy=fmt.removeprefix("fp8-"), symmetric=True,
                            dynamic=False)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> the nearest E2M1 code (uint8 0-15; saturating at ±6, ties to the smaller magnitude)."""
    grid = torch.tensor(E2M1[:8], dtype=torch.float32)
    index = (x.abs()[..., None] - grid).abs().argmin(-1).to(torch.uint8)  # [..]: 0-7
    return index | ((x < 0).to(torch.uint8) << 3)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] codes -> [..., n] bytes, the first of each pair in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def quantize_mxfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """[out, in] -> blocks uint8 [out, in/32, 16], scales uint8 [out, in/32]: per block of 32 the shared
    exponent is floor(log2(amax)) - 2 (E2M1's largest exponent), values rounded to E2M1 and clamped."""
    out, cols = w.shape
    blocks = w.float().reshape(out, cols // 32, 32)
    amax = blocks.abs().amax(-1)  # [out, nb]
    exponent = (torch.floor(torch.log2(amax.clamp_min(2.0 ** -125))) - 2).clamp(-127, 127)
    codes = e2m1_codes(blocks / torch.exp2(exponent)[..., None])
    return {"values": pack_e2m1(codes).contiguous(), "scale": (exponent + 127).to(torch.uint8).contiguous()}


def quantize_nvfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """[out, in] -> values uint8 [out, in/2], E4M3 scale per 16 [out, in/16], fp32 global scale []: the global
    scale maps the tensor's abs max to 6 × 448, each block scale its block's abs max to 6."""
    out, cols = w.shape
    blocks = w.float().reshape(out, cols // 16, 16)
    global_scale = (w.float().abs().max() / (FP4_MAX * FP8_MAX)).clamp_min(1e-12)
    block_scale = (blocks.abs().amax(-1) / FP4_MAX / global_scale).to(torch.float8_e4m3fn)  # [out, nb]
    denominator = block_scale.float() * global_scale
    scaled = torch.where(denominator[..., None] > 0, blocks / denominator.clamp_min(1e-30)[..., None], 0.0)
    return {"values": pack_e2m1(e2m1_codes(scaled)).reshape(out, cols // 2).contiguous(), "scale": block_scale,
            "global_scale": global_scale.reshape(()).contiguous(), "input_scale": torch.tensor(1.0)}


def quantize_fp8(w: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """By compressed-tensors: scale [1] (tensor) or [out, 1] (channel), values float8_e4m3fn."""
    from compressed_tensors.quantization import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = _fp8_args(fmt)
    w = w.float()
    if fmt == "fp8-tensor":
        low, high = w.min().reshape(1), w.max().reshape(1)
    else:
        low, high = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    scale, zero = calculate_qparams(low, high, args)
    values = quantize(w, scale, zero, args, dtype=torch.float8_e4m3fn)
    return {"values": values.contiguous(), "scale": scale.float().contiguous()}


QUANTIZERS = {"mxfp4": quantize_mxfp4, "nvfp4": quantize_nvfp4,
              "fp8-tensor": lambda w: quantize_fp8(w, "fp8-tensor"),
              "fp8-channel": lambda w: quantize_fp8(w, "fp8-channel")}


def quantize_release(src: Path, fmt: str, dst: Path) -> Path:
    """Write ``src`` (an unquantised release) quantised in ``fmt`` into ``dst`` (one ``model.safetensors``,
    config with its ``quantization_config``, tokenizer and generation files copied)."""
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quant_config(fmt)
    model = build_model(config, dtype=torch.float32, device="meta")
    specs: dict[str, QuantSpec] = {n: s.quant for n, s in model.checkpoint_tensors().items() if s.quant is not None}
    if quant_format(config) is None or not specs:
        raise ValueError(f"{config.get('architectures')}: the runtime quantises no weight of this model as {fmt}")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(shard))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in sorted(tensors.items()):
        spec = specs.get(name)
        if spec is None:
            out[name] = tensor
            continue
        parts = QUANTIZERS[fmt](tensor)
        for part in spec.parts:
            if part.role in parts:
                out[part.name] = parts[part.role]
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for extra in src.iterdir():
        if extra.is_file() and not extra.name.startswith(("model.safetensors", "config.json")) \
                and extra.suffix != ".safetensors":
            shutil.copy2(extra, dst / extra.name)
    (dst / "quantization.json").write_text(json.dumps(
        {"format": fmt, "original": ORIGINAL, "quantized_tensors": len(specs),
         "quantizer": "compressed-tensors" if fmt.startswith("fp8") else "day0 (from the format's specification)"},
        indent=2) + "\n")
    return dst


def make_quantized_model(arch: str, fmt: str, size: str = "tiny", seed: int = 0,
                         out: Path | str = Path("model")) -> Path:
    """``out``: the ``fmt`` release of the random-weight ``arch`` model, its original under ``out/original``."""
    if fmt not in QUANT_CHOICES + tuple(INT_WRITERS):
        raise ValueError(f"unknown quantised format {fmt!r} (choose from "
                         f"{', '.join(QUANT_CHOICES + tuple(INT_WRITERS))})")
    if fmt in INT_WRITERS and arch not in INT_ARCHES:
        raise ValueError(f"--quant {fmt} is written for dense architectures ({', '.join(INT_ARCHES)}), not {arch}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"output directory {out} is not empty")
    original = make_model(arch, size, seed, out / ORIGINAL)
    if fmt in INT_WRITERS:  # integer formats (int_models.py): compressed-tensors, GPTQ, AWQ
        return INT_WRITERS[fmt](original, out)[0]
    return quantize_release(original, fmt, out)
