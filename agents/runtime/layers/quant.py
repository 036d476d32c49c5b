"""Block-scaled FP8 checkpoints (the DeepSeek-V3 / Kimi-K2 layout): ``quantization_config`` with
``quant_method: "fp8"`` and ``weight_block_size: [br, bc]``; a linear weight ``W`` is stored as ``float8_e4m3fn``
beside ``W_scale_inv`` (fp32, one per ``br × bc`` block, partial blocks at the edges), and ``W = fp8 × scale``.

The model declares per checkpoint name what it accepts (``TensorSpec``: shape, whether FP8 with which scale);
the loader validates against that and streams an FP8 weight together with its scale as a ``BlockFp8Tensor``;
every parameter's ``weight_loader`` (see ``weights.bind_loader``) dequantises it into the runtime dtype and then
slices for TP as it would a plain tensor, so partial blocks and block/rank boundaries need no special case.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from agents.runtime.layers import quant_float  # noqa: F401 - registers MXFP4, NVFP4, FP8 per tensor/channel
from agents.runtime.layers.fp8_native import is_native, load_native
from agents.runtime.layers.quant_formats import QuantizedTensor, QuantSpec, quant_format

FP8_CODES = ("F8_E4M3",)  # safetensors codes an FP8 weight may be stored in
SCALE_CODES = ("F32", "BF16")


@dataclass(frozen=True)
class BlockFp8Format:
    """``quantization_config`` of a block-scaled FP8 checkpoint."""

    block: tuple[int, int]
    not_converted: tuple[str, ...] = ()  # modules_to_not_convert: these stay in the config's dtype

    def __post_init__(self) -> None:
        if len(self.block) != 2 or not all(isinstance(b, int) and b > 0 for b in self.block):
            raise ValueError(f"quantization_config.weight_block_size must be two positive integers, got {self.block}")

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """Blocks per dimension of a 2-D weight, partial edge blocks included."""
        return -(-shape[0] // self.block[0]), -(-shape[1] // self.block[1])

    def converts(self, name: str) -> bool:
        dotted = f".{name}."
        return not any(f".{m.strip('.')}." in dotted for m in self.not_converted)


def block_fp8_format(config: dict[str, Any]) -> BlockFp8Format | None:
    """The FP8 block format a config declares, None when it declares no FP8 quantisation. ValueError naming the
    key for an FP8 layout this runtime cannot load (per-tensor scales, e5m2)."""
    quant = config.get("quantization_config")
    if not quant:
        return None
    if not isinstance(quant, dict):
        raise ValueError("quantization_config must be an object")
    if str(quant.get("quant_method", "")).lower() != "fp8":
        return None
    block = quant.get("weight_block_size")
    if not isinstance(block, list | tuple):
        raise ValueError("quantization_config: fp8 without 'weight_block_size' (per-tensor scales) is not supported")
    fmt = str(quant.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise ValueError(f"quantization_config.fmt {fmt!r} is not supported (only e4m3)")
    return BlockFp8Format(tuple(block), tuple(quant.get("modules_to_not_convert") or ()))


@dataclass(frozen=True)
class ScaleSpec:
    """The companion of an FP8 weight: its checkpoint name, shape (blocks) and accepted dtypes."""

    name: str
    shape: tuple[int, int]
    block: tuple[int, int]
    dtypes: tuple[str, ...] = SCALE_CODES


@dataclass(frozen=True)
class TensorSpec:
    """What a model accepts under one checkpoint name. Unquantised storage follows the loader's rule (the
    config's dtype, or F32 for tensors kept in full precision); ``fp8`` set means FP8 storage is accepted too,
    and then requires that scale tensor."""

    shape: tuple[int, ...]
    fp8: ScaleSpec | None = None
    quant: QuantSpec | None = None  # stored in a registered format (``quant_formats.py``): only that way


@dataclass
class BlockFp8Tensor:
    """An FP8 checkpoint weight streamed with its block scales; weight loaders call ``dequantize``."""

    name: str
    data: torch.Tensor  # [R, C] float8_e4m3fn
    scale_inv: torch.Tensor  # [ceil(R / br), ceil(C / bc)]
    block: tuple[int, int]
    dequantized: torch.Tensor | None = field(default=None, repr=False)  # the last result, for the loader's stats

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self, dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
        """[R, C] in ``dtype``, computed on ``device`` (the parameter's: the one-byte values travel, not the
        dequantised ones)."""
        data = self.data if device is None else self.data.to(device)
        self.dequantized = dequantize_block_fp8(data, self.scale_inv, self.block, dtype)
        return self.dequantized


def dequantize_block_fp8(data: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                         dtype: torch.dtype) -> torch.Tensor:
    """``data × scale_inv`` block-wise, computed in fp32 and returned in ``dtype``: [R, C]."""
    if data.dim() != 2:
        raise ValueError(f"an FP8 block-scaled weight must be 2-D, got shape {tuple(data.shape)}")
    rows, cols = data.shape
    br, bc = block
    nr, nc = -(-rows // br), -(-cols // bc)
    if tuple(scale_inv.shape) != (nr, nc):
        raise ValueError(f"scale of shape {tuple(scale_inv.shape)} does not cover [{rows}, {cols}] in {br}×{bc} "
                         f"blocks (expected [{nr}, {nc}])")
    scale = scale_inv.to(device=data.device, dtype=torch.float32)
    if rows % br == 0 and cols % bc == 0:
        out = data.to(torch.float32).view(nr, br, nc, bc) * scale[:, None, :, None]  # [nr, br, nc, bc]
        return out.view(rows, cols).to(dtype)
    expanded = scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]  # [R, C]: edges clipped
    return (data.to(torch.float32) * expanded).to(dtype)


def quantize_block_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse, for writing test checkpoints: (fp8 [R, C], scale_inv fp32 [ceil(R/br), ceil(C/bc)]) with each
    block's abs max mapped to the largest e4m3 value."""
    rows, cols = weight.shape
    br, bc = block
    nr, nc = -(-rows // br), -(-cols // bc)
    padded = weight.new_zeros(nr * br, nc * bc, dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    blocks = padded.view(nr, br, nc, bc)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12)  # [nr, nc]
    scale = amax / torch.finfo(torch.float8_e4m3fn).max  # [nr, nc]
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(nr * br, nc * bc)[:rows, :cols]
    return q.contiguous(), scale


def dequantizing(loader: Callable[..., None]) -> Callable[..., None]:
    """Wrap a weight loader so that it also takes a ``BlockFp8Tensor`` or ``QuantizedTensor``: dequantised to the
    parameter's dtype first, then loaded (and TP-sliced) like any checkpoint tensor; into a parameter converted
    to native FP8 (``fp8_native.convert``) the FP8 values go as they are, with their scales."""

    def load(param: nn.Parameter, loaded: Any, shard_id: Hashable = None) -> None:
        if isinstance(loaded, QuantizedTensor) and is_native(param):  # kept FP8 (``fp8_native``)
            load_native(param, loaded, shard_id, loader)
            return
        if isinstance(loaded, BlockFp8Tensor | QuantizedTensor):
            loaded = loaded.dequantize(param.dtype, param.device)  # [R, C]
        loader(param, loaded, shard_id)

    load.inner = loader
    return load


def quantizable_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters an FP8 checkpoint may store block-quantised: the weights of the parallel linears
    (attention and MLA projections, dense and shared-expert MLPs) and of the fused routed experts. Embeddings,
    the LM head, norms, routers and biases stay unquantised (as DeepSeek-V3 and Kimi-K2 ship them)."""
    return {id(p) for p in model.parameters() if getattr(p, "quantizable", False)}  # ``weights.quantizable``


def declare_checkpoint(model: nn.Module, config: dict[str, Any],
                       checkpoint_name: Callable[[str, Hashable], str]) -> dict[str, TensorSpec]:
    """Every checkpoint tensor a model built from loader-protocol parameters (``shards``, ``checkpoint_shape``)
    needs, with what storage it accepts; FP8 with a ``<name>_scale_inv`` companion for quantisable 2-D weights
    when the config declares block-scaled FP8, or the parts of a registered format (``quant_formats.py``) when
    it declares one of those."""
    fmt = block_fp8_format(config)
    other = quant_format(config) if fmt is None else None
    quantizable = quantizable_parameters(model) if fmt or other else set()
    out: dict[str, TensorSpec] = {}
    for param_name, param in model.named_parameters():
        for shard in param.shards:
            name = checkpoint_name(param_name, shard)
            shape = tuple(param.checkpoint_shape(shard))
            scale = None
            if fmt is not None and id(param) in quantizable and len(shape) == 2 and fmt.converts(name):
                scale = ScaleSpec(f"{name}_scale_inv", fmt.scale_shape(shape), fmt.block)
            if other is not None and id(param) in quantizable and len(shape) == 2 and other.converts(name):
                out[name] = TensorSpec(shape, quant=other.spec(name, shape))
                continue
            out[name] = TensorSpec(shape, scale)
    return out
