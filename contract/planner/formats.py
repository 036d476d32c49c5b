"""Quantised weight formats: the true bits each stores per weight, and which format a checkpoint's
``quantization_config`` names.

A format's bits per quantised weight are its packed values plus its scales and zero points:

- ``mxfp4`` (OCP microscaling, gpt-oss experts): 4-bit E2M1 values, one E8M0 (8-bit) scale per 32.
- ``nvfp4`` (NVIDIA): 4-bit E2M1 values, one FP8 E4M3 scale per 16, one fp32 global scale per tensor (negligible).
- ``int4-gG`` (compressed-tensors pack-quantized, GPTQ, AWQ): 4-bit values, one 16-bit scale per group of G
  weights; ``-zp`` adds a 4-bit zero point per group (asymmetric; GPTQ and AWQ store ``qzeros`` always).
  ``int4`` is ``int4-g128``.
- ``int8`` (per output channel), ``float8_e4m3fn-tensor``/``-channel``: one scale per tensor or row (negligible);
  ``float8_e4m3fn`` is block FP8, one fp32 scale per 128×128 block (DeepSeek-V3).
- GGUF (ggml's block layouts): ``q8_0`` blocks of 32 int8 + one fp16 scale (34 bytes per 32 weights);
  ``q4_0`` 32 nibbles + one fp16 scale (18 bytes per 32); ``q4_1`` the same + an fp16 minimum (20 bytes per 32);
  ``q4_k`` super-blocks of 256: fp16 d and dmin, 12 bytes of 6-bit sub-block scales and mins, 128 bytes of
  nibbles (144 bytes per 256); ``q6_k`` super-blocks of 256: 128 + 64 bytes of 6-bit values, 16 int8 sub-block
  scales, one fp16 d (210 bytes per 256).
"""

from __future__ import annotations

import re
from typing import Any

# canonical format -> (bits of quantisable weights, bits of the rest, extra scale/zero-point bits per weight)
FORMATS: dict[str, tuple[float, float, float]] = {
    "float32": (32, 32, 0.0),
    "bfloat16": (16, 16, 0.0),
    "float16": (16, 16, 0.0),
    "float8_e4m3fn": (8, 16, 32 / (128 * 128)),
    "float8_e4m3fn-tensor": (8, 16, 0.0),
    "float8_e4m3fn-channel": (8, 16, 0.0),
    "int8": (8, 16, 0.0),
    "int4": (4, 16, 16 / 128),
    "mxfp4": (4, 16, 8 / 32),
    "nvfp4": (4, 16, 8 / 16),
    "q8_0": (8, 16, 16 / 32),
    "q4_0": (4, 16, 16 / 32),
    "q4_1": (4, 16, 32 / 32),
    "q4_k": (4, 16, (144 * 8 - 4 * 256) / 256),
    "q6_k": (6, 16, (210 * 8 - 6 * 256) / 256),
}
GROUPED = re.compile(r"^int4-g(\d+)(-zp)?$")
# the element type a format's values are stored in: the hardware runs it natively when it declares that type
NATIVE_TYPE = {"float8_e4m3fn-tensor": "float8_e4m3fn", "float8_e4m3fn-channel": "float8_e4m3fn",
               "mxfp4": "float4_e2m1fn", "nvfp4": "float4_e2m1fn", "int4": "int8", "q8_0": "int8"}
# the formats the bundled runtime runs natively (FP8 values and scales kept, ``torch._scaled_mm`` W8A8) where the
# hardware has the element type; every other format it dequantises at load (docs/quantized.md)
RUNTIME_NATIVE = frozenset({"float8_e4m3fn-tensor", "float8_e4m3fn-channel"})
# "experts": only the routed experts are quantised (Kimi-K2-Thinking's ignore list); True: attention stays 16-bit
Keep = bool | str


def format_bits(name: str) -> tuple[float, float, float] | None:
    """(value bits, rest bits, scale + zero-point bits per weight) of a canonical format name; None if unknown."""
    if name in FORMATS:
        return FORMATS[name]
    match = GROUPED.match(name)
    if match and int(match.group(1)) > 0:
        group = int(match.group(1))
        return (4, 16, 16 / group + (4 / group if match.group(2) else 0.0))
    return None


def native_type(name: str) -> str:
    """The element type a hardware must declare to run the format natively (``int4-g32`` -> ``int8``)."""
    return NATIVE_TYPE.get("int4" if GROUPED.match(name) else name, name)


def format_label(name: str) -> str:
    """How a sentence names the format's kind: ``FP4``, ``block FP8``, ``INT4``, ``GGUF q4_k``."""
    if name in ("mxfp4", "nvfp4"):
        return f"FP4 ({name})"
    if name == "float8_e4m3fn":
        return "block FP8"
    if name.startswith("float8_e4m3fn-"):
        return f"FP8 per {name.split('-', 1)[1]}"
    if name.startswith(("int4", "int8")):
        return name[:4].upper()
    return f"GGUF {name}" if name.startswith("q") else name


def emulated_reason(name: str, declared: bool) -> str | None:
    """Why a quantised format runs emulated (dequantised at load) on a hardware, None when it runs native:
    the hardware does not declare its element type, or the runtime has no native path for the format."""
    if not declared:
        return f"the hardware does not declare {native_type(name)}; dequantized at load"
    if name not in RUNTIME_NATIVE:
        kind = format_label(name)
        what = "FP4" if kind.startswith("FP4") else kind
        return f"{kind}: no native {what} matmul in the runtime; dequantized at load"
    return None


def hardware_declares(config: dict[str, Any] | None, dtypes: list[str] | tuple[str, ...] | None) -> bool | None:
    """Whether a hardware's declared dtypes hold the element type of the config's quantised format (None: no
    format, or no dtypes declared). AMD's fnuz FP8 runs the fn format."""
    found = checkpoint_format(config or {})
    if found is None or not dtypes:
        return None
    return native_type(found[0]) in {str(d).removesuffix("uz") for d in dtypes}


def int4_name(group: int | None, asymmetric: bool) -> str:
    group = group if group and group > 0 else 128
    return f"int4-g{group}{'-zp' if asymmetric else ''}"


def _keep(ignored: list[Any], default: Keep) -> Keep:
    text = " ".join(str(m) for m in ignored)
    if "shared_experts" in text and re.search(r"mlp\\*\.\(?(gate|up|down)", text):
        return "experts"
    return True if "self_attn" in text else default


def _compressed_tensors(quant: dict[str, Any]) -> tuple[str, Keep] | None:
    groups = [g.get("weights") or {} for g in (quant.get("config_groups") or {}).values() if isinstance(g, dict)]
    if not groups:
        return None
    weights, fmt = groups[0], str(quant.get("format", ""))
    keep = _keep(quant.get("ignore") or [], False)
    bits, kind = weights.get("num_bits"), str(weights.get("type", "int"))
    strategy = str(weights.get("strategy", "tensor"))
    if kind == "float" and bits == 4 or "nvfp4" in fmt:
        return "nvfp4", keep
    if kind == "float" and bits == 8:
        return ("float8_e4m3fn" if strategy == "block" else f"float8_e4m3fn-{strategy}"
                if strategy in ("tensor", "channel") else "float8_e4m3fn-tensor"), keep
    if bits == 8:
        return "int8", keep
    if bits == 4:
        group = weights.get("group_size") if strategy == "group" else None
        return int4_name(group, weights.get("symmetric") is False), keep
    return None


def checkpoint_format(config: dict[str, Any]) -> tuple[str, Keep] | None:
    """The format the checkpoint's ``quantization_config`` stores its linear weights in, and what stays 16-bit;
    None when the config names no quantisation (or one this table does not know)."""
    quant = config.get("quantization_config") or {}
    if not isinstance(quant, dict) or not quant:
        return None
    method = str(quant.get("quant_method", "")).lower()
    keep = _keep(quant.get("modules_to_not_convert") or [], False)
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    if method in ("fp8", "fbgemm_fp8"):
        return ("float8_e4m3fn" if quant.get("weight_block_size") or method == "fp8" else
                "float8_e4m3fn-channel"), keep
    if method == "mxfp4":
        return "mxfp4", keep
    if method == "modelopt" and "fp4" in str(quant.get("quant_algo", "")).lower():
        return "nvfp4", keep
    if method == "gguf":  # a GGUF release: the type of most of its weights (``gguf_release.release_config``)
        kind = str(quant.get("type", "")).lower()
        return (kind, keep) if kind in FORMATS else None
    if method == "modelopt" and str(quant.get("quant_algo", "")).upper() == "FP8":  # one scale per tensor
        return "float8_e4m3fn-tensor", _keep(quant.get("exclude_modules") or [], False)
    if method in ("gptq", "awq") and quant.get("bits") == 4:  # both store qzeros, symmetric or not
        return int4_name(quant.get("group_size"), True), keep
    if quant.get("bits") in (4, 8):
        return ("int4" if quant["bits"] == 4 else "int8"), keep
    return None
