"""Chart payloads for static/js/charts.js (ECharts options are built in the browser from these)."""

from __future__ import annotations

from typing import Any

from apps.benchmarks.selectors import OPTIONAL_FAMILIES, TREND_FAMILIES, Series, display_value
from apps.dashboards.selectors import CellPage, Day0Timeline

LATENCY_KEYS = (("ttft_ms_p50", "TTFT p50"), ("ttft_ms_p99", "TTFT p99"), ("tpot_ms_p50", "TPOT p50"),
                ("tpot_ms_p99", "TPOT p99"), ("itl_ms_p50", "ITL p50"), ("itl_ms_p99", "ITL p99"))


def _ms(at: Any, cache: dict[Any, int]) -> int:
    """Epoch milliseconds (ECharts' time axis); a run's time repeats across series, so it is computed once."""
    ms = cache.get(at)
    if ms is None:
        ms = cache[at] = int(at.timestamp() * 1000)
    return ms


def layer_chart(page: CellPage) -> dict[str, Any] | None:
    if not page.align_layers:
        return None
    thresholds = page.results["align"].alignment.thresholds or {}
    return {"layers": [{"layer": la.layer, "cosine": la.cosine, "max_rel_err": la.max_rel_err}
                       for la in page.align_layers],
            "cosine_threshold": thresholds.get("layer_cosine", 0.99)}


def bench_chart(page: CellPage) -> dict[str, Any] | None:
    if not page.bench_points:
        return None
    runs = [{"concurrency": p.concurrency, "output_tok_s": p.output_tok_s,
             **{key: getattr(p, key) for key, _ in LATENCY_KEYS}} for p in page.bench_points]
    return {"runs": runs, "latency": [{"field": key, "label": label} for key, label in LATENCY_KEYS]}


def _short_labels(series: list[Series]) -> tuple[dict[Any, str], str]:
    """Line labels naming only what differs between configurations, and what they share."""
    configs = {s.config for s in series}
    same = len({(c.dtype, c.input_len, c.output_len) for c in configs}) == 1
    if not same:
        return {c: c.label for c in configs}, ""
    c0 = next(iter(configs), None)
    shared = "" if c0 is None else c0.label.split(" · ", 1)[1] if " · " in c0.label else ""
    return {c: f"c={c.concurrency}" for c in configs}, shared


def grouped_regressions(series: list[Series]) -> list[dict[str, Any]]:
    """The trends page's table: one row per flagged run and metric, its configurations together (newest first)."""
    labels, _ = _short_labels(series)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for s in series:
        for r in s.regressions:
            key = (r.at, r.ref[1], s.metric)
            g = groups.setdefault(key, {"at": r.at, "job": r.ref[1], "metric": s.metric, "unit": s.unit,
                                        "configs": [], "ratios": [], "z": 0.0})
            g["configs"].append(labels[s.config])
            g["ratios"].append(r.ratio)
            g["z"] = max(g["z"], r.z)
    rows = sorted(groups.values(), key=lambda g: (g["at"], g["metric"]), reverse=True)
    for g in rows:
        low, high = min(g["ratios"]), max(g["ratios"])
        g["change"] = f"×{low:.2f}" if round(low, 2) == round(high, 2) else f"×{low:.2f}–{high:.2f}"
    return rows


# where a ratio's axis starts: 1.0 is no jitter / perfect balance, 0 % no time in collectives (a zoomed axis made
# rounding noise of a flat 1.30 look like swings)
AXIS_FLOORS = {"tpot_jitter": 1, "expert_max_over_mean": 1, "expert_ep_max_over_mean": 1, "comm_overhead_ratio": 0,
               "comm_overhead_ratio_max": 0}


def stack_marks(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hardware's stack changes (``alerts.stacks.series_stack_changes``) as time-axis marks: when, and what
    changed to what."""
    return [{"at": c["at"], "label": ", ".join(f"{k} {c['after'].get(k, '?')}" for k in c["changed"])[:120]}
            for c in changes]


def trend_charts(series: list[Series], stat: str, stack_changes: list[dict[str, Any]] | None = None
                 ) -> tuple[list[dict[str, Any]], str]:
    """One chart per metric family; one line per configuration; regressions as marked points and the stack's
    changes as vertical marks. A family only some runs report (communication overhead, expert balance) has no
    chart when none of these runs do, or all report zero (``absent``). Also returns the configuration every line shares (dtype,
    lengths), shown once above the charts."""
    labels, shared = _short_labels(series)
    marks = stack_marks(stack_changes or [])
    times: dict[Any, int] = {}
    charts = []
    for family, title, unit in TREND_FAMILIES:
        metric = f"{family}_{stat}" if family.endswith("_ms") else family
        lines = []
        for s in series:
            if s.metric != metric:
                continue
            lines.append({
                "label": labels[s.config],
                "points": [[_ms(p.at, times), round(display_value(metric, p.value), 4)] for p in s.points],
                "regressions": [{"at": r.at.isoformat(), "value": round(display_value(metric, r.value), 4),
                                 "baseline_median": display_value(metric, r.baseline_median), "ratio": r.ratio,
                                 "z": r.z, "job": r.ref[1]} for r in s.regressions],
            })
        flagged = sum(len(line["regressions"]) for line in lines)
        charts.append({"id": f"trend-{family}", "data_id": f"trend-{family}-data", "metric": metric, "title": title, "unit": unit,
                       "flagged": flagged,
                       # one rank reports 0 % in collectives: a chart of zeros says nothing the note does not
                       "absent": family in OPTIONAL_FAMILIES and not any(v for line in lines for _, v in line["points"]),
                       "data": {"unit": unit, "series": lines, "stack_changes": marks, "floor": AXIS_FLOORS.get(family)}})
    return charts, shared


def leaderboard_chart(timeline: Day0Timeline) -> dict[str, Any] | None:
    rows = [r for r in timeline.leaderboard if any(m is not None for m in r.medians)]
    if not rows:
        return None
    return {"hardware": [r.hardware.name for r in rows],
            "tiers": [{"tier": t, "label": f"{t} · {name}",
                       "hours": [None if r.medians[i] is None else round(r.medians[i], 1) for r in rows]}
                      for i, (t, name) in enumerate(timeline.tiers)]}
