"""The quality cost of a quantised release: its eval scores against its unquantised original's, task by task,
with a 95 % bound on each difference.

Both releases' eval sections (``eval.tasks``: per task the served target's score, ``n`` and, for accuracies, the
Wilson interval's low end) are compared on the target side: ``delta = quantised - original``. For an accuracy
(a proportion of ``n`` items) the bound is Newcombe's hybrid score interval of a difference of two proportions,
built from each side's Wilson interval (``contract.challenges.scoring.wilson``); it is valid for independent
samples and conservative for the paired ones the same suite gives. A metric without a proportion (perplexity)
gets its delta and no bound. ``cost`` is the drop in the direction that matters (positive: the quantised release
is worse), ``significant`` says the whole interval lies on the worse side.

Pure: standard library only; the portal imports it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from contract.challenges.scoring import wilson


def _proportion(row: Mapping[str, Any]) -> tuple[float, int] | None:
    """(accuracy, n) of a task row whose metric is a proportion of its ``n`` items (it carries a Wilson low)."""
    score, n = row.get("target"), row.get("n")
    if row.get("wilson_low") is None or not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return None
    if not isinstance(score, int | float) or not 0.0 <= float(score) <= 1.0:
        return None
    return float(score), n


def difference_interval(p1: float, n1: int, p2: float, n2: int) -> tuple[float, float]:
    """Newcombe's 95 % interval of ``p1 - p2`` from the two Wilson intervals (method 10)."""
    l1, u1 = wilson(round(p1 * n1), n1)
    l2, u2 = wilson(round(p2 * n2), n2)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def quality_cost(quantised: Sequence[Mapping[str, Any]], original: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per task both eval sections scored with the same metric: the two scores, the delta, its bound and
    the cost (see the module docstring). Rows of malformed entries are skipped, never guessed."""
    by_task = {r.get("task"): r for r in original if isinstance(r, Mapping)}
    rows = []
    for q in quantised:
        if not isinstance(q, Mapping):
            continue
        o = by_task.get(q.get("task"))
        if o is None or o.get("metric") != q.get("metric"):
            continue
        qs, os_ = q.get("target"), o.get("target")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in (qs, os_)):
            continue
        higher = q.get("higher_is_better") is not False
        delta = float(qs) - float(os_)
        low = high = None
        pq, po = _proportion(q), _proportion(o)
        if pq is not None and po is not None:
            low, high = difference_interval(pq[0], pq[1], po[0], po[1])
        cost = -delta if higher else delta
        worse_bound = high if higher else low  # the end of the interval nearest "no loss"
        significant = worse_bound is not None and (worse_bound < 0 if higher else worse_bound > 0)
        rows.append({"task": q.get("task"), "metric": q.get("metric"), "quantized": float(qs), "original": float(os_),
                     "delta": delta, "low": low, "high": high, "n": q.get("n"), "n_original": o.get("n"),
                     "higher_is_better": higher, "cost": cost, "significant": significant})
    return rows
