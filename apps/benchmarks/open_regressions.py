"""Regressions across every benchmark series: the regressions page, and the "open regression" flags of the matrix,
the cell page and the model and hardware pages.

A flagged run is *open* while it is the newest run of its series (nothing ran since to show a recovery); the
detector itself (apps.benchmarks.regressions) stops flagging a step that persists once it becomes the new
median. Each row names the run it flags and the run it is compared with: the newest earlier run of the same
series that was not flagged. Two queries (the runs, their concurrency rows) whatever the history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Max, Subquery

from apps.accounts.access import Actor
from apps.benchmarks.regressions import RegressionRule
from apps.benchmarks.selectors import Series, SeriesQuery, display_unit, display_value, load_series
from apps.catalog.models import ModelRelease
from apps.evidence.models import BenchmarkRun

# The metrics a manager reads first: median latencies, throughput and memory (one per family).
HEADLINE_METRICS = ("ttft_ms_p50", "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50", "output_tok_s", "peak_memory_bytes")
PAGE_ROWS = 50


@dataclass
class RegressionRow:
    """One flagged run of one series, with the run it is compared with."""

    model: str
    hardware: str
    config: str
    metric: str
    unit: str
    at: datetime
    value: float
    baseline_median: float
    ratio: float
    z: float
    job: int | None
    previous_job: int | None
    is_open: bool

    @property
    def change(self) -> str:
        return f"×{self.ratio:.2f}"

    @property
    def shown_value(self) -> float:
        return display_value(self.metric, self.value)

    @property
    def shown_baseline(self) -> float:
        return display_value(self.metric, self.baseline_median)


def _rows_of(series: Series) -> list[RegressionRow]:
    flagged = {r.ref[0] for r in series.regressions}
    newest = series.points[-1].ref[0] if series.points else None
    previous: dict[Any, int | None] = {}
    last_good: int | None = None
    for p in series.points:  # time order: the newest unflagged run before each point
        previous[p.ref[0]] = last_good
        if p.ref[0] not in flagged:
            last_good = p.ref[1]
    return [RegressionRow(series.model, series.hardware, series.config.label, series.metric, display_unit(series.metric), r.at,
                          r.value, r.baseline_median, r.ratio, r.z, r.ref[1], previous.get(r.ref[0]),
                          r.ref[0] == newest) for r in series.regressions]


def regression_rows(actor: Actor, query: SeriesQuery, rule: RegressionRule | None = None, *,
                    open_only: bool = False) -> list[RegressionRow]:
    """Every flagged run ``actor`` may see matching ``query``, newest first (``metrics`` default to the
    headline ones). Raises the selectors' ``SeriesQueryError``/``NotVisible`` on a bad filter."""
    if not query.metrics:
        query = SeriesQuery(**{**query.__dict__, "metrics": HEADLINE_METRICS})
    rows = [row for s in load_series(actor, query, rule=rule) for row in _rows_of(s)]
    if open_only:
        rows = [r for r in rows if r.is_open]
    rows.sort(key=lambda r: (r.at, r.model, r.hardware, r.metric, r.config), reverse=True)
    return rows


@dataclass
class RegressionGroup:
    """The flagged configurations of one run and metric together (one row of the regressions page)."""

    first: RegressionRow
    configs: list[str]
    ratios: list[float]
    z: float
    is_open: bool

    def __getattr__(self, name: str) -> Any:  # model, hardware, metric, unit, at, job, previous_job
        if name == "first":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.first, name)

    @property
    def change(self) -> str:
        low, high = min(self.ratios), max(self.ratios)
        return f"×{low:.2f}" if round(low, 2) == round(high, 2) else f"×{low:.2f}–{high:.2f}"


def group_rows(rows: list[RegressionRow]) -> list[RegressionGroup]:
    """Rows of the same run and metric (its concurrency levels) as one group, newest first as given."""
    groups: dict[tuple[Any, ...], RegressionGroup] = {}
    for r in rows:
        key = (r.model, r.hardware, r.job, r.metric)
        g = groups.get(key)
        if g is None:
            groups[key] = RegressionGroup(r, [r.config], [r.ratio], r.z, r.is_open)
        else:
            g.configs.append(r.config)
            g.ratios.append(r.ratio)
            g.z, g.is_open = max(g.z, r.z), g.is_open or r.is_open
    return list(groups.values())


OPEN_CACHE_SECONDS = 300


def _history_stamp(model: str, hardware: str) -> str:
    """What open flags depend on besides the viewer, in one query: the newest and the number of benchmark runs
    in scope, and the newest model edit (a visibility or release-time change); "" when there is no run."""
    runs = BenchmarkRun.objects.all()
    if model:
        runs = runs.filter(model__slug=model)
    if hardware:
        runs = runs.filter(hardware__slug=hardware)
    edited = ModelRelease.objects.order_by("-updated_at").values("updated_at")[:1]
    # MAX over the runs of the one newest edit: NULL when there is no run, and then nothing is flagged anyway
    row = runs.aggregate(last=Max("id"), n=Count("id"), edited=Max(Subquery(edited)))
    if not row["n"]:
        return ""
    return f"{row['last']}:{row['n']}:{row['edited'].timestamp() if row['edited'] else ''}"


def open_regressions(actor: Actor, *, model: str = "", hardware: str = "") -> dict[tuple[str, str], list[str]]:
    """(model slug, hardware slug) -> the headline metrics whose newest run is flagged. Cached per viewer
    visibility and history stamp (a new run, a deleted one or a model edit recomputes it; an embargo that ends
    shows its flags within ``OPEN_CACHE_SECONDS``)."""
    stamp = _history_stamp(model, hardware)
    if not stamp:  # no benchmark run in scope: nothing to flag
        return {}
    viewer = "staff" if actor.is_staff else ",".join(map(str, sorted(actor.org_ids)))
    key = f"day0:open-regressions:{viewer}:{model}:{hardware}:{stamp}"
    cached = cache.get(key)
    if cached is not None:
        return cached
    out: dict[tuple[str, str], list[str]] = {}
    for row in regression_rows(actor, SeriesQuery(model=model, hardware=hardware), open_only=True):
        metrics = out.setdefault((row.model, row.hardware), [])
        if row.metric not in metrics:
            metrics.append(row.metric)
    cache.set(key, out, OPEN_CACHE_SECONDS)
    return out


def newest_flagged_cell(actor: Actor) -> tuple[str, str] | None:
    """(model slug, hardware slug) of the newest flagged run ``actor`` may see, where the trends page opens without
    a cell; None when nothing is flagged. Finding it runs the detector over every headline series, so it is cached
    per viewer visibility and history stamp like ``open_regressions``: new benchmark results (a new run), a
    deleted run or a model edit make a new key, and the stale entry expires."""
    stamp = _history_stamp("", "")
    if not stamp:
        return None
    viewer = "staff" if actor.is_staff else ",".join(map(str, sorted(actor.org_ids)))
    key = f"day0:trends-newest-flagged:{viewer}:{stamp}"
    cached = cache.get(key)
    if cached is not None:
        return tuple(cached) or None
    rows = regression_rows(actor, SeriesQuery())[:1]
    newest = (rows[0].model, rows[0].hardware) if rows else ()
    cache.set(key, newest, OPEN_CACHE_SECONDS)
    return newest or None
