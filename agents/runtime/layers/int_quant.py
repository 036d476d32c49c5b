"""Integer weight formats: compressed-tensors ``pack-quantized`` INT4/INT8, GPTQ 4-bit and AWQ 4-bit.

Every format stores a linear weight ``W [out, in]`` as integer codes ``q`` with a scale (per group of ``G`` input
columns, or per output channel) and, when asymmetric, a zero point ``z``: ``W = (q - z) × s``. They differ in how
the codes are packed into int32 words and where the scales live:

- compressed-tensors ``pack-quantized`` (``<m>.weight_packed`` int32 ``[out, ceil(in·b/32)]``, codes stored
  offset by ``2^(b-1)`` and read as signed; ``weight_scale [out, in/G]`` or ``[out, 1]``; asymmetric adds
  ``weight_zero_point`` int32 ``[ceil(out·b/32), in/G]``, packed along the output dimension, signed the same way;
  ``weight_shape`` int ``[2]`` = ``[out, in]``). Value ``k`` of a row sits at bits ``(k·b) mod 32`` of word
  ``k·b // 32`` (for b = 4 and 8 no value straddles a word).
- GPTQ (``<m>.qweight`` int32 ``[in/8, out]``, eight input rows per word, low nibble first; ``qzeros`` int32
  ``[groups, out/8]`` packed along the output the same way, stored minus one in the original ``gptq`` checkpoint
  format (``gptq_v2`` stores them as they are); ``scales`` fp16 ``[groups, out]``; ``g_idx`` int32 ``[in]``: the
  group of each input row, a permutation of the groups under act-order (``desc_act``)).
- AWQ GEMM (``qweight`` int32 ``[in, out/8]``, eight output columns per word in the interleaved order
  0 2 4 6 1 3 5 7 (nibble ``i`` holds column ``AWQ_ORDER[i]``); ``qzeros`` int32 ``[in/G, out/8]`` the same way;
  ``scales`` fp16 ``[in/G, out]``; always asymmetric).

The runtime has no integer matmul: these weights are dequantised at load into the runtime dtype (emulated), so
the model takes the runtime dtype's bytes, not the packed ones. Every companion tensor's shape and dtype is
checked first (``companions``); errors name the tensor and the format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column AWQ_ORDER[i] of its eight
INT_CODES = ("I32",)
SCALE_CODES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class IntFormat:
    """An integer weight format read from ``quantization_config``."""

    method: str  # "compressed-tensors" | "gptq" | "awq"
    bits: int
    group: int | None  # input columns per scale; None: one scale per output channel
    symmetric: bool
    act_order: bool = False  # GPTQ desc_act: g_idx permutes the groups
    zero_offset: int = 0  # GPTQ v1 stores zero points minus one
    ignore: tuple[str, ...] = ()  # modules left unquantised (compressed-tensors ``ignore``, ``modules_to_not_convert``)

    @property
    def name(self) -> str:
        label = {"compressed-tensors": "compressed-tensors pack-quantized"}.get(self.method, self.method.upper())
        group = f"group {self.group}" if self.group else "per channel"
        return f"{label} INT{self.bits} ({group}, {'symmetric' if self.symmetric else 'asymmetric'})"

    def converts(self, name: str) -> bool:
        module = name.rsplit(".", 1)[0]
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], module):
                    return False
            elif module == pattern or module.endswith(f".{pattern}") or f".{pattern}." in f".{module}.":
                return False
        return True

    def groups(self, in_features: int) -> int:
        return -(-in_features // self.group) if self.group else 1


def int_format(config: dict[str, Any]) -> IntFormat | None:
    """The integer format a config declares; None for none (or another method). ValueError naming the key for an
    integer layout this runtime cannot load."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    if method in ("gptq", "awq"):
        bits = quant.get("bits", quant.get("w_bit"))
        group = quant.get("group_size", quant.get("q_group_size"))
        if bits != 4:
            raise ValueError(f"quantization_config: {method} with bits={bits!r} is not supported (4 only)")
        if not isinstance(group, int) or (group <= 0 and group != -1):
            raise ValueError(f"quantization_config: {method} group_size {group!r} must be a positive integer or -1")
        if method == "awq":
            version = str(quant.get("version", "gemm")).lower()
            if version != "gemm" or quant.get("zero_point", True) is False:
                raise ValueError(f"quantization_config: AWQ version {version!r} (zero_point="
                                 f"{quant.get('zero_point', True)}) is not supported (GEMM with zero points only)")
            return IntFormat("awq", 4, group if group > 0 else None, False,
                             ignore=tuple(quant.get("modules_to_not_convert") or ()))
        checkpoint = str(quant.get("checkpoint_format", "gptq")).lower()
        if checkpoint not in ("gptq", "gptq_v2"):
            raise ValueError(f"quantization_config: GPTQ checkpoint_format {checkpoint!r} is not supported")
        return IntFormat("gptq", 4, group if group > 0 else None, bool(quant.get("sym", True)),
                         act_order=bool(quant.get("desc_act", False)), zero_offset=1 if checkpoint == "gptq" else 0,
                         ignore=tuple(quant.get("modules_to_not_convert") or ()))
    return None


def _compressed_tensors(quant: dict[str, Any]) -> IntFormat | None:
    fmt = str(quant.get("format", "")).lower()
    groups = quant.get("config_groups") or {}
    if fmt != "pack-quantized":
        return None  # float formats (float-quantized, nvfp4-pack-quantized): the registry of quant_formats.py
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ValueError(f"quantization_config: compressed-tensors with {len(groups)} config_groups is not supported "
                         f"(one scheme for every converted linear)")
    scheme = next(iter(groups.values()))
    weights = scheme.get("weights") if isinstance(scheme, dict) else None
    if not isinstance(weights, dict):
        raise ValueError("quantization_config: the compressed-tensors scheme has no 'weights' arguments")
    if scheme.get("input_activations") or scheme.get("output_activations"):
        raise ValueError("quantization_config: compressed-tensors activation quantisation is not supported "
                         "(weight-only schemes)")
    bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
    if kind == "float":
        return None  # FP4/FP8 in the pack-quantized container: the float registry decides
    if kind != "int" or bits not in (4, 8):
        raise ValueError(f"quantization_config: compressed-tensors weights of type {kind!r} with num_bits {bits!r} "
                         f"are not supported (int, 4 or 8 bits)")
    if strategy not in ("group", "channel") or weights.get("actorder") not in (None, False, "static"):
        raise ValueError(f"quantization_config: compressed-tensors strategy {strategy!r} (actorder "
                         f"{weights.get('actorder')!r}) is not supported (group or channel)")
    group = weights.get("group_size") if strategy == "group" else None
    if strategy == "group" and (not isinstance(group, int) or group <= 0):
        raise ValueError(f"quantization_config: compressed-tensors group_size {group!r} must be a positive integer")
    return IntFormat("compressed-tensors", bits, group, bool(weights.get("symmetric", True)),
                     ignore=tuple(quant.get("ignore") or ()))


def companions(fmt: IntFormat, out_features: int, in_features: int) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Per suffix (after the module's name): the shape and the accepted safetensors dtypes the format stores a
    ``[out, in]`` weight as."""
    groups = fmt.groups(in_features)
    per_word = 32 // fmt.bits
    if fmt.method == "compressed-tensors":
        out = {"weight_packed": ((out_features, -(-in_features // per_word)), INT_CODES),
               "weight_scale": ((out_features, groups), SCALE_CODES),
               "weight_shape": ((2,), ("I32", "I64"))}
        if not fmt.symmetric:
            out["weight_zero_point"] = ((-(-out_features // per_word), groups), INT_CODES)
        return out
    if fmt.method == "gptq":
        return {"qweight": ((in_features // per_word, out_features), INT_CODES),
                "qzeros": ((groups, out_features // per_word), INT_CODES),
                "scales": ((groups, out_features), SCALE_CODES), "g_idx": ((in_features,), INT_CODES)}
    return {"qweight": ((in_features, out_features // per_word), INT_CODES),
            "qzeros": ((groups, out_features // per_word), INT_CODES), "scales": ((groups, out_features), SCALE_CODES)}


def divisibility(fmt: IntFormat, out_features: int, in_features: int) -> str | None:
    """Why a ``[out, in]`` weight cannot be stored in ``fmt`` (None when it can)."""
    if fmt.method in ("gptq", "awq"):
        if fmt.method == "gptq" and in_features % 8:
            return f"{in_features} input features are not a multiple of 8 (GPTQ packs eight rows per word)"
        if out_features % 8:
            return f"{out_features} output features are not a multiple of 8 ({fmt.method.upper()} packs eight per word)"
        if fmt.group and in_features % fmt.group:
            return f"{in_features} input features are not a multiple of the group size {fmt.group}"
    return None


def unpack_words(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Unsigned ``bits``-wide codes from int32 words along the last dimension, value ``k`` at bits
    ``(k·bits) mod 32`` of word ``k·bits // 32``, the first ``count`` kept: int32 ``[..., count]``."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)  # [per_word]
    codes = (words.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., words, per_word]
    return codes.flatten(-2)[..., :count]


def pack_words(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of ``unpack_words`` (unsigned codes along the last dimension, zero-padded to whole words)."""
    per_word = 32 // bits
    cols = codes.shape[-1]
    padded = torch.nn.functional.pad(codes.to(torch.int64), (0, (-cols) % per_word))
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    words = (padded.unflatten(-1, (-1, per_word)) << shifts).sum(-1)  # [..., words] in [0, 2^32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def dequantize_int(fmt: IntFormat, parts: dict[str, torch.Tensor], out_features: int,
                   in_features: int) -> torch.Tensor:
    """``W [out, in]`` in fp32 from a module's stored tensors (shapes already checked by the loader)."""
    if fmt.method == "compressed-tensors":
        offset = 1 << (fmt.bits - 1)
        q = unpack_words(parts["weight_packed"], fmt.bits, in_features) - offset  # [out, in] signed codes
        scale = parts["weight_scale"].float()  # [out, groups]
        zero = torch.zeros_like(scale)
        if not fmt.symmetric:  # packed along the output dimension: [ceil(out·b/32), groups]
            zero = (unpack_words(parts["weight_zero_point"].t(), fmt.bits, out_features) - offset).t().float()
        return _grouped(q.float(), scale, zero, fmt.group or in_features)
    if fmt.method == "gptq":
        q = unpack_words(parts["qweight"].t(), 4, in_features).t()  # [in, out]
        zeros = unpack_words(parts["qzeros"], 4, out_features) + fmt.zero_offset  # [groups, out]
        g_idx = parts["g_idx"].long()  # [in]
        weight = (q - zeros[g_idx]).float() * parts["scales"].float()[g_idx]  # [in, out]
        return weight.t().contiguous()
    order = torch.tensor([AWQ_ORDER.index(c) for c in range(8)])  # column c sits at nibble order[c]
    q = unpack_words(parts["qweight"], 4, out_features).unflatten(-1, (-1, 8))[..., order].flatten(-2)  # [in, out]
    zeros = unpack_words(parts["qzeros"], 4, out_features).unflatten(-1, (-1, 8))[..., order].flatten(-2)
    rows = torch.arange(in_features) // (fmt.group or in_features)
    return ((q - zeros[rows]).float() * parts["scales"].float()[rows]).t().contiguous()


def _grouped(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    """``(q - z) × s`` with one scale per ``group`` consecutive columns (the last group may be partial)."""
    cols = torch.arange(q.shape[1]) // group  # [in]
    return (q - zero[:, cols]) * scale[:, cols]


def check_g_idx(fmt: IntFormat, g_idx: torch.Tensor, in_features: int) -> str | None:
    """Why a GPTQ ``g_idx`` is wrong (None when right): every row in a group that exists, ``G`` rows per group,
    and without act-order exactly ``row // G``."""
    groups = fmt.groups(in_features)
    group = fmt.group or in_features
    if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
        bad = int(((g_idx < 0) | (g_idx >= groups)).nonzero()[0, 0])
        return f"assigns input row {bad} to group {int(g_idx[bad])}, but there are {groups} groups of {group}"
    counts = torch.bincount(g_idx.long(), minlength=groups)
    if bool((counts != group).any()):
        g = int((counts != group).nonzero()[0, 0])
        return f"puts {int(counts[g])} input rows in group {g}, the group size is {group}"
    if not fmt.act_order and not torch.equal(g_idx.long(), torch.arange(in_features) // group):
        return "is not row // group_size, and the config declares no act-order (desc_act: false)"
    return None
