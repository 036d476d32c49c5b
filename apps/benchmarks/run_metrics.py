"""Series metrics read from each ``runs`` entry of a bench section rather than a column of
``BenchmarkPoint``: the communication overhead ratio (rank 0's, and the slowest rank's), TPOT jitter (p99 / p50;
from the TPOT percentiles for runs recorded before the key) and the MoE expert imbalance (max / mean tokens per
expert, and per EP rank). Pure Python."""

from __future__ import annotations

from typing import Any

from apps.benchmarks.regressions import RUN_METRICS


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def run_metric(run: dict[str, Any], metric: str) -> float | None:
    """``metric`` (one of ``RUN_METRICS``) of one run; None when the run does not report it."""
    if metric in ("comm_overhead_ratio", "comm_overhead_ratio_max"):
        return _number(run.get(metric))
    if metric == "tpot_jitter":
        own = _number(run.get("tpot_jitter"))
        if own is not None:
            return own
        tpot = run.get("tpot_ms") if isinstance(run.get("tpot_ms"), dict) else {}
        p50, p99 = _number(tpot.get("p50")), _number(tpot.get("p99"))
        return p99 / p50 if p50 and p99 is not None else None
    if metric in ("expert_max_over_mean", "expert_ep_max_over_mean"):
        balance = run.get("expert_balance")
        if not isinstance(balance, dict):
            return None
        if metric == "expert_ep_max_over_mean":  # one EP rank holds every expert: nothing to balance
            ep = balance.get("ep_size")
            return _number(balance.get("ep_max_over_mean")) if isinstance(ep, int) and ep > 1 else None
        return _number(balance.get("max_over_mean"))
    raise ValueError(f"unknown run metric {metric!r}: expected one of {', '.join(RUN_METRICS)}")


def run_values(runs: Any, metrics: list[str], concurrency: int | None = None
               ) -> list[tuple[int, list[float | None]]]:
    """(concurrency, the metrics' values) per sweep run of a section's ``runs`` (a run without an integer
    concurrency is skipped; ``concurrency`` keeps one level)."""
    out = []
    for run in runs if isinstance(runs, list) else []:
        if not isinstance(run, dict):
            continue
        level = run.get("concurrency")
        if not isinstance(level, int) or isinstance(level, bool) or (concurrency is not None and level != concurrency):
            continue
        out.append((level, [run_metric(run, m) for m in metrics]))
    return out
