"""The alignment reference of a quantised release: the same numbers in fp32 (``transformers``' implementation on
the checkpoint's weights dequantised), so operator and layer alignment judge the runtime's kernels and loader,
and the quantisation's own cost is left to end-to-end and eval against the original.

The dequantisation here is independent of the runtime's (``layers/quant_float.py``): the quantised weights are
found by the formats' own naming, and each is dequantised by the format's library where it has one that runs on a
CPU — ``transformers``' MXFP4 integration (``convert_moe_packed_tensors``), ``compressed-tensors`` for FP8
(``dequantize``) and for NVFP4's E2M1 unpacking (``unpack_fp4_from_uint8``, block scales expanded here). A loader
or kernel fault in the runtime (scales read transposed, a group size off by one) then shows at the layer that holds
it instead of being reproduced by the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from agents.runtime.layers.quant_float import Fp8Scaled, Mxfp4, Nvfp4
from agents.runtime.layers.quant_formats import QuantFormat, quant_format
from agents.runtime.loader.checkpoint import Checkpoint


def _mxfp4(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out = {}
    for name in [n for n in tensors if n.endswith("_blocks")]:
        base = name.removesuffix("_blocks")
        blocks, scales = tensors.pop(name), tensors.pop(f"{base}_scales")
        # transformers' layout is gpt-oss's experts [E, out, G, 16] -> [E, in, out]: one "expert" here
        out[base] = convert_moe_packed_tensors(blocks[None], scales[None], dtype=torch.float32)[0].T.contiguous()
    return out


def _nvfp4(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    out = {}
    for name in [n for n in tensors if n.endswith(".weight_scale_2")]:
        base = name.removesuffix(".weight_scale_2")
        packed, scale = tensors.pop(f"{base}.weight"), tensors.pop(f"{base}.weight_scale")
        global_scale = tensors.pop(name).float().reshape(())
        tensors.pop(f"{base}.input_scale", None)
        rows, cols = packed.shape[0], packed.shape[1] * 2
        values = unpack_fp4_from_uint8(packed, rows, cols, dtype=torch.float32)
        out[f"{base}.weight"] = values * scale.float().repeat_interleave(cols // scale.shape[1], 1) * global_scale
    return out


def _fp8(tensors: dict[str, torch.Tensor], strategy: str) -> dict[str, torch.Tensor]:
    from compressed_tensors.quantization import QuantizationArgs, dequantize

    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True)
    out = {}
    for name in [n for n in tensors if n.endswith(".weight_scale")]:
        base = name.removesuffix(".weight_scale")
        values, scale = tensors.pop(f"{base}.weight"), tensors.pop(name).float()
        tensors.pop(f"{base}.input_scale", None)
        tensors.pop(f"{base}.weight_zero_point", None)
        out[f"{base}.weight"] = dequantize(values, scale.reshape(-1, 1) if strategy == "channel" else scale.reshape(1),
                                           None, args, dtype=torch.float32)
    return out


# format class -> its independent dequantiser (tensors by name, the format) -> {unquantised name: fp32 weight};
# it pops the parts it consumed. Other format modules add theirs with ``REFERENCE[Cls] = fn``.
REFERENCE: dict[type[QuantFormat], Callable[[dict[str, torch.Tensor], Any], dict[str, torch.Tensor]]] = {
    Mxfp4: lambda tensors, fmt: _mxfp4(tensors),
    Nvfp4: lambda tensors, fmt: _nvfp4(tensors),
    Fp8Scaled: lambda tensors, fmt: _fp8(tensors, fmt.strategy),
}


def dequantized_weights(model_dir: Path | str, fmt: QuantFormat) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor in fp32 under its unquantised name, the quantised ones dequantised."""
    ckpt = Checkpoint.open(model_dir)
    tensors: dict[str, torch.Tensor] = {}
    for path in ckpt.files:
        with safe_open(path, framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118 - not a dict
    dequantize = next((fn for cls, fn in REFERENCE.items() if isinstance(fmt, cls)), None)
    if dequantize is None:
        raise ValueError(f"no independent {fmt.label} dequantiser for the alignment reference")
    weights = dequantize(tensors, fmt)
    return {**{n: t.float() for n, t in tensors.items()}, **weights}


def dequantized_reference(model_dir: Path | str, config: dict[str, Any]) -> torch.nn.Module | None:
    """``transformers``' model for ``config`` in fp32 on the dequantised weights; None when the config declares
    no format of this registry (an unquantised or block-FP8 release loads with transformers' own loader)."""
    fmt = quant_format(config)
    if fmt is None:
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    plain = {k: v for k, v in config.items() if k != "quantization_config"}
    hf_config = AutoConfig.for_model(plain.pop("model_type"), **plain)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(dequantized_weights(model_dir, fmt), strict=False)
    tied = {"lm_head.weight"} if hf_config.get_text_config().tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"the dequantised {fmt.label} weights do not fit transformers' model: missing "
                         f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
    model.tie_weights()
    return model.eval()
