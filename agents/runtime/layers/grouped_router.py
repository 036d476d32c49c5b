"""DeepSeek-V3 routing: sigmoid expert scores, a score-correction bias that steers selection only, group-limited
top-k (keep the ``topk_group`` best of ``n_group`` expert groups, a group scored by its two best experts), then
renormalised weights times ``routed_scaling_factor``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from agents.runtime.layers.weights import make_param, replicated


def grouped_topk(
    router_logits: torch.Tensor,  # [T, E] fp32
    top_k: int,
    n_group: int,
    topk_group: int,
    *,
    correction_bias: torch.Tensor | None = None,  # [E]
    scoring: str = "sigmoid",
    renormalize: bool = True,
    scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick ``top_k`` experts per token; returns (weights [T, k] fp32, expert ids [T, k] int64)."""
    num_tokens, num_experts = router_logits.shape
    if n_group < 1 or num_experts % n_group:
        raise ValueError(f"n_group={n_group} must divide the number of experts {num_experts}")
    if not 1 <= topk_group <= n_group:
        raise ValueError(f"topk_group={topk_group} must be between 1 and n_group={n_group}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be between 1 and the number of experts {num_experts}")
    if scoring == "sigmoid":
        scores = router_logits.sigmoid()  # [T, E]
    elif scoring == "softmax":
        scores = router_logits.softmax(dim=-1)  # [T, E]
    else:
        raise ValueError(f"unknown scoring function {scoring!r} (expected 'sigmoid' or 'softmax')")
    choice = scores if correction_bias is None else scores + correction_bias  # [T, E]
    if topk_group < n_group:
        per_group = num_experts // n_group
        grouped = choice.view(num_tokens, n_group, per_group)  # [T, G, E/G]
        group_scores = grouped.topk(min(2, per_group), dim=-1).values.sum(dim=-1)  # [T, G]
        keep = group_scores.topk(topk_group, dim=-1).indices  # [T, topk_group]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)  # [T, G]
        expert_mask = group_mask.unsqueeze(-1).expand(-1, -1, per_group).reshape(num_tokens, num_experts)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices  # [T, k]
    weights = scores.gather(1, ids)  # [T, k]; the bias never enters the weights
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling_factor, ids


class GroupedTopKRouter(nn.Module):
    """The gate of a DeepSeek-V3 MoE layer: ``weight`` [E, hidden] and ``e_score_correction_bias`` [E], both
    kept in fp32 (as the reference does) whatever the model dtype; routing runs in fp32."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        *,
        n_group: int = 1,
        topk_group: int = 1,
        scoring: str = "sigmoid",
        renormalize: bool = True,
        scaling_factor: float = 1.0,
        use_correction_bias: bool = True,
    ) -> None:
        super().__init__()
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.scoring, self.renormalize, self.scaling_factor = scoring, renormalize, scaling_factor
        self.weight = replicated(make_param((num_experts, hidden_size), dtype=torch.float32))
        self.e_score_correction_bias = (
            replicated(make_param((num_experts,), dtype=torch.float32)) if use_correction_bias else None
        )
        grouped_topk(torch.zeros(1, num_experts), top_k, n_group, topk_group, scoring=scoring)  # validate early

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module signature
        # dtype casts of the whole model leave the router in fp32; device moves still apply
        super()._apply(fn, recurse)
        self.weight.data = self.weight.data.float()
        if self.e_score_correction_bias is not None:
            self.e_score_correction_bias.data = self.e_score_correction_bias.data.float()
        return self

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # hidden: [T, hidden]
        logits = F.linear(hidden.float(), self.weight)  # [T, E] fp32
        return grouped_topk(
            logits, self.top_k, self.n_group, self.topk_group, correction_bias=self.e_score_correction_bias,
            scoring=self.scoring, renormalize=self.renormalize, scaling_factor=self.scaling_factor,
        )
