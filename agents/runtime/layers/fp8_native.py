"""Native FP8 linears (W8A8), as vLLM runs FP8 checkpoints on FP8 hardware: the weight stays in memory as
``float8_e4m3fn`` [out_local, in_local] with one fp32 scale per output row (``weight.fp8_scale`` [out_local]; a
per-tensor scale is repeated over its rows, so merged q/k/v or gate/up shards keep their own), and each matmul
quantises the activations dynamically per token to E4M3 (row scale = the row's abs max / 448) and calls
``torch._scaled_mm`` with the row scales of both sides, out in the activations' dtype. Device-agnostic: the same
call runs on CPU (torch's reference kernel) and on CUDA from compute capability 8.9.

Which formats: ``contract.planner.formats.RUNTIME_NATIVE`` (FP8 per tensor / per channel). Which weights: the
parameters the linear layers mark ``native_fp8`` (their forward goes through ``linear.dense_linear``); a weight
read elsewhere (MLA's absorbed ``kv_b_proj``) or a fused expert stays dequantised (emulated).

Loading (``convert``, then the loader's stream): ``convert`` turns the chosen parameters into empty FP8 storage
plus their scale vector; ``quant.dequantizing`` hands such a parameter the checkpoint's FP8 values untouched (the
layer's own loader slices them for TP) and ``load_scales`` slices the per-row scales the same way (``rows_of``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from torch import nn

from agents.runtime.layers.quant_formats import QuantizedTensor
from contract.planner.formats import RUNTIME_NATIVE

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
MODES = ("auto", "native", "emulated")


def is_native(weight: torch.Tensor) -> bool:
    return weight.dtype == FP8 and getattr(weight, "fp8_scale", None) is not None


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (E4M3 [T, K], fp32 scale [T, 1]) with each row's abs max mapped to 448 (dynamic per token)."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` with ``weight`` E4M3 [out, in] and ``weight.fp8_scale`` fp32 [out]: W8A8 through
    ``torch._scaled_mm``, in ``x``'s dtype."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    xq, x_scale = quantize_rows(x2)
    w_scale = weight.fp8_scale.view(1, -1)  # [1, out]
    out = weight.shape[0]
    if x.device.type == "cuda" and (k % 16 or out % 16):  # cuBLASLt's FP8 GEMM needs 16-aligned K and N
        y = ((xq.float() * x_scale) @ (weight.float() * w_scale.t()).t()).to(x.dtype)
    else:
        y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, out)


def native_param(param: nn.Parameter) -> bool:
    """Whether the parameter can be held in FP8 (its layer multiplies through ``dense_linear``)."""
    return bool(getattr(param, "native_fp8", False)) and param.dim() == 2


def convert(param: nn.Parameter) -> None:
    """Empty FP8 storage [out_local, in_local] and an fp32 scale per output row, on the parameter's device."""
    param.data = torch.empty(param.shape, dtype=FP8, device=param.device)
    param.fp8_scale = torch.ones(param.shape[0], dtype=torch.float32, device=param.device)


def load_native(param: nn.Parameter, loaded: QuantizedTensor, shard_id: Hashable, inner: Any) -> None:
    """One checkpoint weight into an FP8 parameter: the values through the layer's own loader (TP slice), the
    per-row scales sliced the same way."""
    fmt = loaded.spec.format
    if fmt.name not in RUNTIME_NATIVE:
        raise ValueError(f"{fmt.label} has no native path in the runtime (only FP8 per tensor / per channel)")
    zero = loaded.parts.get("zero_point")
    if zero is not None and bool((zero.float() != 0).any()):
        raise ValueError(f"{fmt.label}: a non-zero weight_zero_point (asymmetric FP8) is not supported")
    rows = loaded.spec.shape[0]
    scale = loaded.parts["scale"].to(device=param.device, dtype=torch.float32).reshape(-1)
    load_rows(param, param, loaded.parts["values"].to(param.device), scale.expand(rows) if scale.numel() == 1
              else scale, shard_id, inner)


def load_rows(like: nn.Parameter, dest: nn.Parameter, values: torch.Tensor, scale: torch.Tensor,
              shard_id: Hashable, inner: Any) -> None:
    """FP8 ``values`` [R, C] of one checkpoint shard into ``dest`` through the layer's loader ``inner`` (its TP
    slice), and their row scales ``scale`` [R] into ``dest.fp8_scale`` at the rows ``like.rows_of`` says."""
    inner(dest, values, shard_id)
    offset, start, taken = like.rows_of(shard_id)
    dest.fp8_scale.narrow(0, offset, taken).copy_(scale.narrow(0, start, taken))


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [R, C] as E4M3 with one fp32 scale per row (abs max -> 448): a checkpoint in the per-channel form."""
    scale = (weight.float().abs().amax(dim=1) / FP8_MAX).clamp_min(1e-12)
    return (weight.float() / scale[:, None]).to(FP8), scale


def runtime_bytes(model: nn.Module) -> int:
    """Bytes the native FP8 weights take: values plus their fp32 row scales."""
    return sum(p.numel() * p.element_size() + p.fp8_scale.numel() * 4 for p in model.parameters() if is_native(p))


def mode_for(name: str | None, asked: str, hardware_declares: bool | None, device_has: bool | None) -> str:
    """``native`` or ``emulated`` for a quantised format (``name``, the planner's) under ``--quant-mode``:
    ``auto`` is native where the format has a native path and the job's hardware declares its element type or
    the device has it; ``native`` is refused (ValueError, naming the format) where the format has no native path."""
    if asked not in MODES:
        raise ValueError(f"quant mode {asked!r}: expected one of {', '.join(MODES)}")
    if asked == "emulated":
        return "emulated"
    has_path = name in RUNTIME_NATIVE
    if asked == "native":
        if not has_path:
            raise ValueError(f"--quant-mode native: {name or 'this release'} has no native path in the runtime "
                             f"(native: FP8 per tensor and per channel); it runs emulated (dequantized at load)")
        return "native"
    return "native" if has_path and (hardware_declares or device_has) else "emulated"
