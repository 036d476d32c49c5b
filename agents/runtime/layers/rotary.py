"""Rotary position embeddings: default, linear, Llama-3 and YaRN frequency scalings, partial rotary, and a
cos/sin table computed once (grown on demand) so decode steps only index it."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from agents.runtime import kernels


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """Rope settings from either config format (``rope_parameters`` or ``rope_theta`` + ``rope_scaling``)."""
    params = dict(config.get("rope_scaling") or {})
    params.update(config.get("rope_parameters") or {})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if "partial_rotary_factor" in config:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    return params


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(params: dict[str, Any], dim: int, base: float, max_positions: int) -> tuple[torch.Tensor, float]:
    original = params.get("original_max_position_embeddings") or max_positions
    factor = params.get("factor") or max_positions / original
    scaling = params.get("attention_factor")
    if scaling is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        scaling = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all else (
            _yarn_mscale(factor))
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [dim/2]
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolate = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv_freq, float(scaling)


def _llama3(params: dict[str, Any], inv_freq: torch.Tensor) -> torch.Tensor:
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def inv_frequencies(params: dict[str, Any], rotary_dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim/2], attention scaling applied to cos/sin)."""
    base = float(params["rope_theta"])
    kind = params["rope_type"]
    if kind == "yarn":
        return _yarn(params, rotary_dim, base, max_positions)
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / params["factor"], 1.0
    if kind == "llama3":
        return _llama3(params, inv_freq), 1.0
    raise ValueError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3, yarn)")


class RotaryEmbedding(nn.Module):
    """Applies RoPE to ``q [T, H, D]`` and ``k [T, Hkv, D]`` at ``positions [T]``; only the first
    ``rotary_dim`` channels rotate. ``interleaved`` pairs channels (2i, 2i+1) instead of (i, i + d/2)."""

    def __init__(self, head_dim: int, config: dict[str, Any], *, interleaved: bool = False,
                 initial_positions: int = 4096) -> None:
        super().__init__()
        params = rope_parameters(config)
        self.rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        self.max_positions = int(config.get("max_position_embeddings", initial_positions))
        inv_freq, self.scaling = inv_frequencies(params, self.rotary_dim, self.max_positions)
        self.interleaved = interleaved
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self._length = 0
        self._initial = min(initial_positions, self.max_positions)

    def _grow(self, needed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables ``[L, 2, rot/2]``: cos as (cos, cos) and sin as (-sin, sin), so rotating the two halves of
        x is ``x * cos + x.flip(halves) * sin``."""
        if needed > self._length:
            length = max(needed, self._initial, 2 * self._length)
            pos = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
            freqs = pos[:, None] * self.inv_freq.float()[None, :]  # freqs: [L, rot/2]
            cos, sin = freqs.cos() * self.scaling, freqs.sin() * self.scaling
            self._tables = {torch.float32: (torch.stack((cos, cos), 1), torch.stack((-sin, sin), 1))}
            self._length = length
        if dtype not in self._tables:
            cos, sin = self._tables[torch.float32]
            self._tables[dtype] = (cos.to(dtype), sin.to(dtype))
        return self._tables[dtype]

    def cos_sin(self, positions: torch.Tensor, max_position: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        cos, sin = self._grow(max_position, dtype)
        return cos.index_select(0, positions).unsqueeze(1), sin.index_select(0, positions).unsqueeze(1)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, H, D] -> rotated [T, H, D] (a new tensor)."""
        rot, half = self.rotary_dim, self.rotary_dim // 2
        if self.interleaved:
            x1, x2 = x[..., 0:rot:2], x[..., 1:rot:2]
            c, s = cos[:, :, 1], sin[:, :, 1]  # [T, 1, rot/2]
            out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
        else:
            xr = x if rot == x.shape[-1] else x[..., :rot]
            halves = xr.unflatten(-1, (2, half))  # [T, H, 2, rot/2]
            out = torch.addcmul(halves * cos, halves.flip(-2), sin).flatten(-2)  # [T, H, rot]
        return out if rot == x.shape[-1] else torch.cat((out, x[..., rot:]), dim=-1)

    def rotate_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``rotate``, in place where the fused fp32 CPU kernel covers the case (the caller owns ``x``);
        otherwise a new tensor. Returns the rotated tensor either way."""
        if not self.interleaved and kernels.rotary_(x, cos, sin, self.rotary_dim):
            return x
        return self.rotate(x, cos, sin)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                max_position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        needed = int(positions.max()) + 1 if max_position is None else max_position
        cos, sin = self.cos_sin(positions, needed, q.dtype)
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin)
