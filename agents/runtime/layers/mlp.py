"""SwiGLU MLP: merged gate/up column-parallel projection, row-parallel down projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from agents.runtime import kernels
from agents.runtime.layers.linear import MergedColumnParallelLinear, RowParallelLinear


def check_activation(name: str | None) -> None:
    if name not in (None, "silu", "swish"):
        raise ValueError(f"hidden_act={name!r} is not supported by the native SwiGLU MLP (only silu)")


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    out = kernels.silu_and_mul(gate_up)  # fp32 CPU: one fused kernel
    if out is not None:
        return out
    gate, up = gate_up.chunk(2, dim=-1)  # gate, up: [T, I]
    return F.silu(gate) * up


class SwiGLUMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, hidden_act: str | None = "silu",
                 reduce_results: bool = True) -> None:
        super().__init__()
        check_activation(hidden_act)
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate])
        self.down_proj = RowParallelLinear(intermediate, hidden, reduce_results=reduce_results)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))  # [T, hidden]
