"""Integer-quantised copies of a test model, for the loaders in ``loader/int_release.py``: compressed-tensors
pack-quantized (quantised and packed by the ``compressed-tensors`` library itself), GPTQ and AWQ 4-bit (packed
here from their published layouts: AutoGPTQ's ``qweight``/``qzeros``/``scales``/``g_idx`` and AutoAWQ's GEMM
interleave; the GPTQ and AWQ libraries do not install on this CPU-only machine). Values are round-to-nearest per
group from each group's min and max (the formats, not the calibration algorithms, are what the loaders read).

Each writer also returns the dequantised weights its checkpoint means (``reference``): for compressed-tensors as
that library decompresses them, for GPTQ/AWQ ``(q - z) × s`` from the codes before packing, so a loader that
unpacks wrongly disagrees with it. ``write_reference`` saves them as a plain fp32 release."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from agents.runtime.layers.int_quant import AWQ_ORDER, pack_words

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")


def converted(name: str, t: torch.Tensor) -> bool:
    return t.dim() == 2 and name.endswith(".weight") and name.split(".")[-2] in LINEARS


def read_release(src: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return json.loads((src / "config.json").read_text()), tensors


def _save(src: Path, out: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    if (out / "config.json").exists():
        raise FileExistsError(f"{out} already holds a release")
    for name in SIDE_FILES:
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    return out


def write_reference(src: Path, out: Path, reference: dict[str, torch.Tensor]) -> Path:
    """``src`` with its converted weights replaced by the dequantised ones: the unquantised reference release."""
    config, tensors = read_release(src)
    return _save(src, out, config, {**tensors, **reference})


def write_compressed_tensors(src: Path, out: Path, *, bits: int = 4, group: int | None = 32,
                             symmetric: bool = True) -> tuple[Path, dict[str, torch.Tensor]]:
    """A compressed-tensors ``pack-quantized`` copy of ``src`` (group or, with ``group=None``, channel scales)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy="group" if group else "channel",
                            group_size=group)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    qconfig = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized", ignore=["lm_head"],
                                 quantization_status="compressed")
    config, tensors = read_release(src)
    out_tensors: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if not converted(name, w):
            out_tensors[name] = w
            continue
        grouped = w.unflatten(-1, (-1, group)) if group else w.unsqueeze(1)  # [out, groups, G]
        scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)  # [out, groups]
        state = {"weight": w, "weight_scale": scale, "weight_zero_point": zero.to(torch.int8)}
        packed = PackedQuantizationCompressor.compress(state, scheme)
        module = name.removesuffix(".weight")
        out_tensors.update({f"{module}.{k}": v for k, v in packed.items()})
        reference[name] = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"].float()
    config["quantization_config"] = qconfig.model_dump(exclude_none=True)
    return _save(src, out, config, out_tensors), reference


def _rtn(w: torch.Tensor, rows_of_group: torch.Tensor, groups: int, symmetric: bool,
         zero_floor: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest 4-bit codes of ``w [in, out]`` with one (scale, zero) per group of input rows:
    (q [in, out] in 0..15, zeros [groups, out] in zero_floor..15, scales [groups, out])."""
    lo = torch.stack([w[rows_of_group == g].amin(0) for g in range(groups)]).clamp(max=0)  # [groups, out]
    hi = torch.stack([w[rows_of_group == g].amax(0) for g in range(groups)]).clamp(min=0)
    if symmetric:
        hi = torch.maximum(hi, -lo)
        lo = -hi
    scales = ((hi - lo) / 15).clamp(min=1e-8).half()  # stored in fp16, so quantise with the stored value
    zeros = torch.full_like(scales, 8, dtype=torch.int64) if symmetric else \
        torch.round(-lo / scales.float()).clamp(zero_floor, 15).long()
    q = torch.round(w / scales.float()[rows_of_group] + zeros[rows_of_group]).clamp(0, 15).long()
    return q, zeros, scales


def write_gptq(src: Path, out: Path, *, group: int = 32, act_order: bool = False, symmetric: bool = True,
               seed: int = 0) -> tuple[Path, dict[str, torch.Tensor]]:
    """A GPTQ 4-bit copy (``checkpoint_format: gptq``, zero points stored minus one); with ``act_order`` each
    weight's input rows are assigned to groups in a random order (``g_idx`` a permutation of the groups)."""
    config, tensors = read_release(src)
    gen = torch.Generator().manual_seed(seed)
    out_tensors: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if not converted(name, w):
            out_tensors[name] = w
            continue
        rows = w.shape[1]
        g_idx = torch.arange(rows) // group
        if act_order:
            g_idx = g_idx[torch.randperm(rows, generator=gen)]
        q, zeros, scales = _rtn(w.t().float(), g_idx, rows // group, symmetric, zero_floor=1)  # q [in, out]
        # (zero_floor 1: v1's stored ``zero - 1`` cannot hold a zero point of 0)
        module = name.removesuffix(".weight")
        out_tensors[f"{module}.qweight"] = pack_words(q.t(), 4).t()  # [in/8, out]: eight input rows per word
        out_tensors[f"{module}.qzeros"] = pack_words(zeros - 1, 4)  # v1 stores zero - 1 (zero 8 as 7)
        out_tensors[f"{module}.scales"] = scales
        out_tensors[f"{module}.g_idx"] = g_idx.to(torch.int32)
        reference[name] = ((q - zeros[g_idx]).float() * scales.float()[g_idx]).t().contiguous()
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order,
                                     "sym": symmetric, "checkpoint_format": "gptq"}
    return _save(src, out, config, out_tensors), reference


def awq_pack(codes: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's GEMM packing of ``codes [rows, cols]``: eight columns per word, nibble i holding column
    AWQ_ORDER[i] of the eight."""
    interleaved = codes.unflatten(-1, (-1, 8))[..., list(AWQ_ORDER)].flatten(-2)
    return pack_words(interleaved, 4)


def write_awq(src: Path, out: Path, *, group: int = 32) -> tuple[Path, dict[str, torch.Tensor]]:
    """An AWQ GEMM 4-bit copy (asymmetric, zero points)."""
    config, tensors = read_release(src)
    out_tensors: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if not converted(name, w):
            out_tensors[name] = w
            continue
        rows = torch.arange(w.shape[1]) // group
        q, zeros, scales = _rtn(w.t().float(), rows, w.shape[1] // group, symmetric=False)
        module = name.removesuffix(".weight")
        out_tensors[f"{module}.qweight"] = awq_pack(q)  # [in, out/8]
        out_tensors[f"{module}.qzeros"] = awq_pack(zeros)  # [groups, out/8]
        out_tensors[f"{module}.scales"] = scales
        reference[name] = ((q - zeros[rows]).float() * scales.float()[rows]).t().contiguous()
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                     "version": "gemm"}
    return _save(src, out, config, out_tensors), reference


# ``day0 make-model --quant``: the integer formats (dense architectures: the writers convert the attention and MLP
# linears by their Llama-style names)
INT_WRITERS = {
    "int4-ct": lambda src, out: write_compressed_tensors(src, out),
    "int4-ct-asym": lambda src, out: write_compressed_tensors(src, out, symmetric=False),
    "int8-ct": lambda src, out: write_compressed_tensors(src, out, bits=8, group=None),
    "gptq": lambda src, out: write_gptq(src, out),
    "gptq-actorder": lambda src, out: write_gptq(src, out, act_order=True, symmetric=False),
    "awq": lambda src, out: write_awq(src, out),
}
INT_ARCHES = ("llama", "qwen3")
