"""Float quantised formats, as published checkpoints store them (registered in ``quant_formats.py``):

- **MXFP4** (OCP microscaling; gpt-oss, transformers' ``mxfp4`` integration): ``quant_method: "mxfp4"``. A weight
  ``W`` [out, in] is stored as ``W_blocks`` uint8 [out, in/32, 16] (32 E2M1 values per block, two per byte, the
  low nibble first) and ``W_scales`` uint8 [out, in/32] (E8M0: the block's scale is 2^(s - 127)).
- **NVFP4** (NVIDIA modelopt): ``quant_method: "modelopt"``, ``quant_algo: "NVFP4"``, ``group_size: 16``. ``W`` is
  uint8 [out, in/2] (E2M1, two per byte, low nibble first), ``weight_scale`` float8_e4m3fn [out, in/16] (one per
  16 values), ``weight_scale_2`` fp32 [] (the tensor's global scale), ``input_scale`` fp32 [] (the activations',
  unused by a weight-only runtime): ``W = e2m1 × weight_scale × weight_scale_2``.
- **FP8 per tensor / per channel**: compressed-tensors (``format: "float-quantized"`` or ``"naive-quantized"``,
  one config group of 8-bit ``float`` weights, ``strategy: "tensor"`` or ``"channel"``) or modelopt
  (``quant_algo: "FP8"``, per tensor). ``W`` float8_e4m3fn [out, in], ``weight_scale`` [] or [1] (tensor) or
  [out, 1] (channel), fp32/bf16/fp16, ``W = fp8 × weight_scale``; an ``input_scale`` may accompany it.

Every format here is dequantised at load into the runtime dtype (computed in fp32): emulated, the model then
takes the runtime dtype's bytes, and the packed parts are dropped from memory as soon as each weight is loaded.
"""

from __future__ import annotations

from typing import Any

import torch

from agents.runtime.layers.quant_formats import PartSpec, QuantFormat, register

# the 16 E2M1 codes (sign bit 3, two exponent bits, one mantissa bit)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SCALAR = ((), (1,))
FLOAT_SCALES = ("F32", "BF16", "F16")


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] -> fp32 [..., 2n]: two E2M1 codes per byte, the low nibble first."""
    lut = torch.tensor(E2M1, dtype=torch.float32, device=packed.device)
    low, high = lut[(packed & 0x0F).long()], lut[(packed >> 4).long()]
    return torch.stack((low, high), dim=-1).flatten(-2)


def _grouped(shape: tuple[int, ...], group: int, name: str, label: str) -> tuple[int, int]:
    if len(shape) != 2:
        raise ValueError(f"{name}: {label} stores 2-D weights, this one has shape {list(shape)}")
    out, cols = shape
    if cols % group:
        raise ValueError(f"{name}: {cols} input features are not a multiple of {label}'s block of {group}")
    return out, cols // group


class Mxfp4(QuantFormat):
    name, label, native_type = "mxfp4", "MXFP4", "float4_e2m1fn"
    block = 32

    def parts(self, name: str, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        out, blocks = _grouped(shape, self.block, name, self.label)
        return (PartSpec("values", f"{name}_blocks", ((out, blocks, self.block // 2),), ("U8",),
                         "MXFP4 E2M1 values, 32 per block packed two per byte"),
                PartSpec("scale", f"{name}_scales", ((out, blocks),), ("U8",), "MXFP4 E8M0 scale per 32 values"))

    def dequantize(self, parts: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
        values = unpack_e2m1(parts["values"])  # [out, blocks, 32]
        exponent = parts["scale"].to(torch.int32) - 127  # [out, blocks]
        return torch.ldexp(values, exponent[..., None].float()).reshape(shape)


class Nvfp4(QuantFormat):
    name, label, native_type = "nvfp4", "NVFP4", "float4_e2m1fn"
    block = 16

    def parts(self, name: str, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        out, blocks = _grouped(shape, self.block, name, self.label)
        base = name.removesuffix(".weight")
        return (PartSpec("values", name, ((out, shape[1] // 2),), ("U8",), "NVFP4 E2M1 values packed two per byte"),
                PartSpec("scale", f"{base}.weight_scale", ((out, blocks),), ("F8_E4M3",),
                         "NVFP4 FP8 E4M3 scale per 16 values"),
                PartSpec("global_scale", f"{base}.weight_scale_2", SCALAR, ("F32",), "NVFP4 global fp32 scale"),
                PartSpec("input_scale", f"{base}.input_scale", SCALAR, ("F32",), "NVFP4 activation scale",
                         optional=True))

    def dequantize(self, parts: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
        out, blocks = shape[0], shape[1] // self.block
        values = unpack_e2m1(parts["values"]).view(out, blocks, self.block)
        scale = parts["scale"].float() * parts["global_scale"].float().reshape(())  # [out, blocks]
        return (values * scale[..., None]).reshape(shape)


class Fp8Scaled(QuantFormat):
    """FP8 E4M3 with one scale per tensor or per output channel."""

    native_type = "float8_e4m3fn"

    def __init__(self, strategy: str, not_converted: tuple[str, ...] = ()) -> None:
        super().__init__(not_converted)
        self.strategy = strategy
        self.name = f"float8_e4m3fn-{strategy}"
        self.label = f"FP8 per {strategy}"

    def parts(self, name: str, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        if len(shape) != 2:
            raise ValueError(f"{name}: {self.label} stores 2-D weights, this one has shape {list(shape)}")
        base = name.removesuffix(".weight")
        scales = SCALAR if self.strategy == "tensor" else ((shape[0], 1),)
        return (PartSpec("values", name, (shape,), ("F8_E4M3",), f"{self.label} E4M3 values"),
                PartSpec("scale", f"{base}.weight_scale", scales, FLOAT_SCALES, f"{self.label} weight scale"),
                PartSpec("zero_point", f"{base}.weight_zero_point", scales, ("F32", "BF16", "F16", "I8", "F8_E4M3"),
                         f"{self.label} zero point (symmetric: all zero)", optional=True),
                PartSpec("input_scale", f"{base}.input_scale", SCALAR, FLOAT_SCALES, f"{self.label} activation scale",
                         optional=True))

    def dequantize(self, parts: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
        zero = parts.get("zero_point")
        if zero is not None and bool((zero.float() != 0).any()):
            raise ValueError(f"{self.label}: a non-zero weight_zero_point (asymmetric FP8) is not supported")
        scale = parts["scale"].float()
        scale = scale.reshape(()) if self.strategy == "tensor" else scale.reshape(shape[0], 1)
        return parts["values"].float() * scale


def _excluded(quant: dict[str, Any], *keys: str) -> tuple[str, ...]:
    out: list[str] = []
    for key in keys:
        value = quant.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"quantization_config.{key} must be a list of module names")
        out += value
    return tuple(out)


@register
def parse_mxfp4(quant: dict[str, Any]) -> QuantFormat | None:
    if str(quant.get("quant_method", "")).lower() != "mxfp4":
        return None
    return Mxfp4(_excluded(quant, "modules_to_not_convert"))


@register
def parse_modelopt(quant: dict[str, Any]) -> QuantFormat | None:
    if str(quant.get("quant_method", "")).lower() != "modelopt":
        return None
    algo = str(quant.get("quant_algo", "")).upper()
    excluded = _excluded(quant, "exclude_modules", "modules_to_not_convert", "ignore")
    if quant.get("kv_cache_quant_algo"):  # its k_scale/v_scale tensors quantise a cache the runtime keeps unscaled
        raise ValueError(f"quantization_config.kv_cache_quant_algo {quant['kv_cache_quant_algo']!r} (modelopt) is "
                         f"not supported (the runtime's KV cache is unquantised)")
    if algo == "NVFP4":
        if quant.get("group_size", 16) != 16:
            raise ValueError(f"quantization_config.group_size {quant.get('group_size')!r}: NVFP4 blocks are 16")
        return Nvfp4(excluded)
    if algo == "FP8":
        return Fp8Scaled("tensor", excluded)
    raise ValueError(f"quantization_config.quant_algo {quant.get('quant_algo')!r} (modelopt) is not supported "
                     f"(the runtime loads modelopt NVFP4 and FP8)")


@register
def parse_compressed_fp8(quant: dict[str, Any]) -> QuantFormat | None:
    """compressed-tensors with 8-bit float weights; None for its other schemes (integer formats parse those)."""
    if str(quant.get("quant_method", "")).lower() != "compressed-tensors":
        return None
    groups = [g for g in (quant.get("config_groups") or {}).values() if isinstance(g, dict)]
    weights = [g.get("weights") or {} for g in groups]
    if not weights or not any(w.get("type") == "float" and w.get("num_bits") == 8 for w in weights):
        return None
    if len(weights) != 1:
        raise ValueError(f"quantization_config.config_groups: {len(weights)} groups; the runtime loads one FP8 group")
    w = weights[0]
    fmt = str(quant.get("format", ""))
    if fmt not in ("float-quantized", "naive-quantized"):
        raise ValueError(f"quantization_config.format {fmt!r} with FP8 weights is not supported "
                         f"(float-quantized or naive-quantized)")
    strategy = str(w.get("strategy", "tensor"))
    if strategy not in ("tensor", "channel"):
        raise ValueError(f"quantization_config: FP8 weights with strategy {strategy!r} are not supported "
                         f"(tensor or channel)")
    if w.get("symmetric") is False:
        raise ValueError("quantization_config: asymmetric FP8 weights are not supported")
    return Fp8Scaled(strategy, _excluded(quant, "ignore"))
