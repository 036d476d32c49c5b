"""RMSNorm, computed in fp32 and cast back like the reference implementations."""

from __future__ import annotations

import torch
from torch import nn

from agents.runtime import kernels
from agents.runtime.layers.weights import make_param, replicated


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self._eps = torch.tensor(eps, dtype=torch.float32)  # a 0-dim tensor: a Python float costs a wrap per op
        self._inv_dim = 1.0 / dim
        self.weight = replicated(make_param((dim,)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = kernels.rms_norm(x, self.weight, self.eps)  # fp32 CPU: one fused kernel
        if out is not None:
            return out
        if x.dtype == torch.float32:  # the reference's arithmetic in 5 small kernels (F.rms_norm runs 7 on CPU)
            mean_sq = torch.add(self._eps, (x * x).sum(-1, keepdim=True), alpha=self._inv_dim)  # [..., 1]
            return x * torch.rsqrt(mean_sq) * self.weight
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)  # xf: [..., dim]
        return self.weight * xf.to(dtype)

    def add_forward(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h = x + delta, this norm of h): the residual add and the next norm of a decoder layer, fused into
        one kernel on fp32 CPU."""
        fused = kernels.add_rms_norm(x, delta, self.weight, self.eps)
        if fused is not None:
            return fused
        h = x + delta
        return h, self(h)
