"""The bench section's ``expert_balance``: how evenly a MoE's router spread tokens over its experts, from the
per-layer expert counts. The agent's bench stage computes it from the server's counters; the portal computes
the same for the seeded demo history."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _std(values: Sequence[float]) -> float:
    """The population standard deviation (numpy's default, ddof 0)."""
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _blocks(row: Sequence[float], ep: int) -> list[float]:
    """``row`` split into ``ep`` contiguous blocks (the experts of each EP rank, as the runtime places them),
    each summed."""
    width = len(row) // ep
    return [sum(row[i * width:(i + 1) * width]) for i in range(ep)]


def expert_balance(counts: Sequence[Sequence[int]], ep_size: int = 1) -> dict[str, Any] | None:
    """Per-layer expert counts summarised: max/mean load per layer (1.0 is perfect balance, averaged over layers
    and the worst layer), coefficient of variation, tokens per expert (all layers) and per EP rank (experts
    partitioned in contiguous blocks, as the runtime places them) with that rank's max/mean. None when no layer
    routed a token."""
    rows = [[float(v) for v in row] for row in counts]
    rows = [r for r in rows if sum(r) > 0]
    if not rows:
        return None
    ratio = [max(r) / _mean(r) for r in rows]
    experts = len(rows[0])
    full = [r for r in rows if len(r) == experts]  # layers routing over every expert (a dense layer has none)
    per_expert = [sum(column) for column in zip(*full, strict=True)]
    ep = ep_size if ep_size >= 1 and experts % ep_size == 0 else 1
    per_rank = _blocks(per_expert, ep)
    # the busiest rank's share of the layer, per layer: what an EP step waits for
    rank_ratio = [max(_blocks(r, ep)) / (sum(r) / ep) for r in full]
    return {
        "layers": len(rows),
        "experts": experts,
        "max_over_mean": round(_mean(ratio), 4),
        "worst_layer_max_over_mean": round(max(ratio), 4),
        "cv": round(_mean([_std(r) / _mean(r) for r in rows]), 4),
        "routed_tokens": int(sum(sum(r) for r in rows)),
        "tokens_per_expert": [int(v) for v in per_expert],
        "ep_size": ep,
        "tokens_per_ep_rank": [int(v) for v in per_rank],
        "ep_max_over_mean": round(_mean(rank_ratio), 4),
    }
