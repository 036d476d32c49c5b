"""GGUF K-quant quantisers (Q4_K, Q6_K) written here from the GGUF/ggml block layouts: the ``gguf`` package
dequantises K-quants but cannot quantise them (``gguf.quants.quantize`` raises NotImplementedError), and a test
K-quant release needs both. Round-to-nearest within each sub-block (llama.cpp's importance-weighted search is a
better fit, not a different format); the tests check every block round-trips through ``gguf.quants.dequantize``.

- Q4_K: 256 weights in 144 bytes: ``d`` and ``dmin`` (fp16), 12 bytes of eight 6-bit scales and eight 6-bit mins
  (one per sub-block of 32; bytes 0-3 hold scales 0-3 and the top two bits of scales 4-7, bytes 4-7 the mins
  likewise, bytes 8-11 the low four bits of scale and min 4-7), then 128 bytes of 4-bit codes (byte ``l`` of chunk
  ``c`` holds weight ``l`` of sub-block ``2c`` in its low nibble, of ``2c+1`` in its high). ``w = d·sc·q - dmin·m``.
- Q6_K: 256 weights in 210 bytes: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one per
  16 weights), ``d`` (fp16). Element ``e`` of half ``h = e // 128``, ``r = e % 128``: low nibble in byte
  ``64h + r % 64`` (high nibble when ``r >= 64``), its two high bits in byte ``32h + r % 32`` at shift
  ``2·(r // 32)``. ``w = d·scale·(q - 32)``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

QK_K = 256


def _blocks(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float32)
    if values.shape[-1] % QK_K:
        raise ValueError(f"K-quants need rows that are a multiple of {QK_K} values, got {values.shape[-1]}")
    return values.reshape(-1, QK_K)


def _fp16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """``values [..., n·256]`` as Q4_K: uint8 ``[..., n·144]``."""
    x = _blocks(values).reshape(-1, 8, 32)  # [blocks, sub, 32]
    lo = np.minimum(x.min(-1), 0)  # [blocks, 8]
    hi = np.maximum(x.max(-1), 0)
    scale, minimum = (hi - lo) / 15, -lo  # w ≈ scale·q - minimum, q in 0..15
    d = (scale.max(-1) / 63).astype(np.float16)  # [blocks]
    dmin = (minimum.max(-1) / 63).astype(np.float16)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 63).astype(np.uint8)
    m = np.clip(np.round(np.divide(minimum, dminf, out=np.zeros_like(minimum), where=dminf > 0)), 0, 63)
    m = m.astype(np.uint8)
    step = (df * sc)[..., None]  # [blocks, 8, 1]
    offset = (dminf * m)[..., None]
    q = np.clip(np.round(np.divide(x + offset, step, out=np.zeros_like(x), where=step > 0)), 0, 15).astype(np.uint8)
    packed_scales = np.concatenate([
        (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6),
        (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4),
    ], axis=-1).astype(np.uint8)  # [blocks, 12]
    pairs = q.reshape(-1, 4, 2, 32)  # [blocks, chunk, (low, high), 32]
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)
    out = np.concatenate([_fp16_bytes(d), _fp16_bytes(dmin), packed_scales, qs], axis=-1)
    return out.reshape(*np.shape(values)[:-1], -1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """``values [..., n·256]`` as Q6_K: uint8 ``[..., n·210]``."""
    x = _blocks(values).reshape(-1, 16, 16)  # [blocks, group, 16]
    group_scale = np.abs(x).max(-1) / 31  # [blocks, 16]: q - 32 in -32..31
    d = (group_scale.max(-1) / 127).astype(np.float16)  # [blocks]
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(group_scale, df, out=np.zeros_like(group_scale), where=df > 0)), -128, 127)
    step = (df * sc)[..., None]
    q = np.clip(np.round(np.divide(x, step, out=np.zeros_like(x), where=step != 0)), -32, 31).astype(np.int16) + 32
    q = q.reshape(-1, 2, 128).astype(np.uint8)  # [blocks, half, 128]
    low, high = q & 0x0F, q >> 4
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(-1, 128)  # [blocks, 2·64]
    hq = high.reshape(-1, 2, 4, 32)  # [blocks, half, shift, 32]
    qh = (hq[:, :, 0] | (hq[:, :, 1] << 2) | (hq[:, :, 2] << 4) | (hq[:, :, 3] << 6)).reshape(-1, 64)
    out = np.concatenate([ql.astype(np.uint8), qh.astype(np.uint8), sc.astype(np.int8).view(np.uint8),
                          _fp16_bytes(d)], axis=-1)
    return out.reshape(*np.shape(values)[:-1], -1)


QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}


def requantize_gguf(src: Path, out: Path, types: Callable[[str, tuple[int, ...]], str | None]) -> Path:
    """A copy of GGUF ``src`` at ``out`` (a file) with every tensor for which ``types(name, shape)`` names a
    K-quant re-quantised to it from its dequantised values; metadata and the other tensors as they are."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"]
    writer = gguf.GGUFWriter(out, bytes(arch.parts[arch.data[0]]).decode())
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(field.name, field.contents())
        else:
            writer.add_key_value(field.name, field.contents(), field.types[0])
    for t in reader.tensors:
        target = types(t.name, tuple(int(d) for d in reversed(t.shape.tolist())))
        if target is None:
            data = np.asarray(t.data)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        data = QUANTIZERS[target](values)
        writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[target])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
