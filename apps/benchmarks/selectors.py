"""Benchmark time series and their regressions, shared by the trends page, the cell page and the API.

A series is one model, hardware, configuration (dtype, concurrency, input and output lengths) and metric,
over the benchmark runs' times. Loading any number of series costs a constant number of queries: the runs
(with their job's spec) in one, their concurrency rows in another."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_date, parse_datetime
from django.utils.timezone import is_naive, make_aware

from apps.accounts.access import Actor
from apps.benchmarks.regressions import (
    RUN_METRICS,
    ParameterError,
    Point,
    Regression,
    RegressionRule,
    detect_regressions,
    known_metrics,
)
from apps.benchmarks.run_metrics import run_values
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import visible_models_q
from apps.core.validators import as_utc
from apps.evidence.models import BenchmarkPoint, BenchmarkRun
from contract.engines import DEFAULT_ENGINE

# Runs one request may read; a wider query must be narrowed (by model, hardware or since).
MAX_RUNS = 20_000
GIB = 1024**3

# The trends page: one chart per metric family. Latency families take a statistic (mean, p50, p90, p99).
TREND_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("ttft_ms", "Time to first token (TTFT)", "ms"),
    ("tpot_ms", "Time per output token (TPOT)", "ms"),
    ("itl_ms", "Inter-token latency (ITL)", "ms"),
    ("output_tok_s", "Output tokens/s", "tok/s"),
    ("peak_memory_bytes", "Peak memory", "GiB"),
    ("comm_overhead_ratio", "Communication overhead (rank 0)", "% of step"),
    ("comm_overhead_ratio_max", "Communication overhead (slowest rank)", "% of step"),
    ("tpot_jitter", "TPOT jitter (p99 / p50)", "×"),
    ("expert_max_over_mean", "Expert imbalance (max / mean tokens per expert)", "×"),
    ("expert_ep_max_over_mean", "EP rank imbalance (max / mean tokens per rank)", "×"),
)
# families shown only when some run reports them (a dense model on one device has no collectives or experts)
OPTIONAL_FAMILIES = RUN_METRICS
LATENCY_STATS = ("p50", "p90", "p99", "mean")


def metric_unit(metric: str) -> str:
    """The unit of a metric's values as the API and the exports carry them (raw: memory in bytes, a
    communication overhead as a fraction of step time). Pages convert with ``display_value`` / ``display_unit``."""
    if metric == "peak_memory_bytes":
        return "bytes"
    if metric == "output_tok_s":
        return "tok/s"
    if metric == "req_s":
        return "req/s"
    if metric in ("comm_overhead_ratio", "comm_overhead_ratio_max"):
        return "fraction of step time"
    if metric in RUN_METRICS:
        return "ratio"
    return "ms"


def display_value(metric: str, value: float) -> float:
    """The value in the unit charts show (bytes become GiB, a fraction of step time a percentage)."""
    if metric in ("comm_overhead_ratio", "comm_overhead_ratio_max"):
        return value * 100  # percent of step time
    return value / GIB if metric == "peak_memory_bytes" else value


def display_unit(metric: str) -> str:
    """The unit of ``display_value(metric, ...)``: what a page prints beside a converted value."""
    if metric == "peak_memory_bytes":
        return "GiB"
    if metric in ("comm_overhead_ratio", "comm_overhead_ratio_max"):
        return "% of step"
    return metric_unit(metric)


class SeriesQueryError(ParameterError):
    """A bad filter; ``param`` and the message name the parameter."""


class NotVisible(LookupError):
    """An unknown or invisible model or hardware slug; the message names it."""


@dataclass(frozen=True, order=True)
class Configuration:
    """What makes two runs comparable besides model and hardware. ``engine``: the serving engine's name ("" for
    the bundled runtime) — not its version, so one engine's versions form one series and a slower version is a
    regression of it, while two engines never share a baseline."""

    dtype: str
    concurrency: int
    input_len: int | None = None
    output_len: int | None = None
    engine: str = ""

    @property
    def label(self) -> str:
        lengths = f" · {self.input_len}→{self.output_len} tok" if self.input_len or self.output_len else ""
        return f"c={self.concurrency} · {self.dtype or '?'}{lengths}" + (f" · {self.engine}" if self.engine else "")

    def as_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "concurrency": self.concurrency, "input_len": self.input_len,
                "output_len": self.output_len, **({"engine": self.engine} if self.engine else {})}


@dataclass
class Series:
    """One metric of one model, hardware and configuration over time (points in time order)."""

    model: str
    hardware: str
    config: Configuration
    metric: str
    points: list[Point] = field(default_factory=list)
    regressions: list[Regression] = field(default_factory=list)

    @property
    def unit(self) -> str:
        return metric_unit(self.metric)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "hardware": self.hardware, "config": self.config.as_dict(),
            "label": self.config.label, "metric": self.metric, "unit": self.unit,
            "points": [{"at": p.ref[2], "value": p.value, "run": p.ref[0], "job": p.ref[1], "synthetic": p.ref[3],
                        "baseline": p.baseline} for p in self.points],
            "regressions": [regression_dict(self, r) for r in self.regressions],
        }


def regression_dict(series: Series, r: Regression) -> dict[str, Any]:
    return {"model": series.model, "hardware": series.hardware, "config": series.config.as_dict(),
            "label": series.config.label, "unit": series.unit, **r.as_dict(), "run": r.ref[0], "job": r.ref[1]}


def _parse_time(name: str, raw: str) -> datetime:
    try:  # a well-formed but impossible date (2025-02-30) raises ValueError
        value = parse_datetime(raw)
        if value is None:
            day = parse_date(raw)
            if day is not None:
                value = datetime(day.year, day.month, day.day)
    except ValueError as exc:
        raise SeriesQueryError(name, f"{name} is not a valid date: {raw!r} ({exc})") from None
    if value is None:
        raise SeriesQueryError(name, f"{name} must be an ISO date or date-time, got {raw!r}")
    try:  # in UTC: PostgreSQL refuses offsets beyond ±15:59
        return as_utc(make_aware(value) if is_naive(value) else value)
    except ValueError as exc:
        raise SeriesQueryError(name, f"{name} {raw!r} is out of range: {exc}") from None


@dataclass(frozen=True)
class SeriesQuery:
    """Filters of a series request. ``since`` limits the points returned and flagged, not the baseline."""

    model: str = ""
    hardware: str = ""
    metrics: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    concurrency: int | None = None
    dtype: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SeriesQuery:
        """From query parameters: model, hardware, metric (repeatable or comma-separated), since, until,
        concurrency, dtype. Raises ``SeriesQueryError`` naming the bad parameter."""
        raw_metrics: list[str] = []
        getlist = getattr(params, "getlist", None)
        for raw in (getlist("metric") if getlist else [params.get("metric") or ""]):
            raw_metrics += [m.strip() for m in str(raw).split(",") if m.strip()]
        known = known_metrics()
        unknown = [m for m in raw_metrics if m not in known]
        if unknown:
            raise SeriesQueryError("metric", f"metric: unknown {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        concurrency = None
        if params.get("concurrency") not in (None, ""):
            try:
                concurrency = int(params["concurrency"])
            except ValueError:
                raise SeriesQueryError("concurrency", f"concurrency must be an integer, got {params['concurrency']!r}") from None
        since = _parse_time("since", params["since"]) if params.get("since") else None
        until = _parse_time("until", params["until"]) if params.get("until") else None
        if since and until and until < since:
            raise SeriesQueryError("until", "until must not be before since")
        return cls(model=str(params.get("model") or ""), hardware=str(params.get("hardware") or ""),
                   metrics=tuple(dict.fromkeys(raw_metrics)), since=since, until=until, concurrency=concurrency,
                   dtype=str(params.get("dtype") or ""))


def resolve_cell(actor: Actor, model_slug: str, hardware_slug: str) -> tuple[ModelRelease | None, Hardware | None]:
    """The visible model and the hardware named by slugs (either may be blank). Raises ``NotVisible``."""
    model = hardware = None
    if model_slug:
        model = ModelRelease.objects.filter(visible_models_q(actor), slug=model_slug).first()
        if model is None:
            raise NotVisible(f"no model with slug {model_slug!r}")
    if hardware_slug:
        hardware = Hardware.objects.filter(slug=hardware_slug).first()
        if hardware is None:
            raise NotVisible(f"no hardware with slug {hardware_slug!r}")
    return model, hardware


def _config_of(spec: Any, concurrency: int) -> Configuration:
    spec = spec if isinstance(spec, dict) else {}
    bench = spec.get("bench") if isinstance(spec.get("bench"), dict) else {}

    def as_int(v: Any) -> int | None:
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    engine = spec.get("engine") if isinstance(spec.get("engine"), dict) else {}
    name = str(engine.get("name") or "")[:64]
    return Configuration(str(spec.get("dtype") or ""), concurrency, as_int(bench.get("input_len")),
                         as_int(bench.get("output_len")), "" if name == DEFAULT_ENGINE else name)


def load_series(actor: Actor, query: SeriesQuery, *, rule: RegressionRule | None = None,
                detect: bool = True) -> list[Series]:
    """Every series matching ``query`` that ``actor`` may see, with regressions flagged (two queries, plus one
    per slug filter). The baseline of points at the start of ``since`` uses the runs before it."""
    model, hardware = resolve_cell(actor, query.model, query.hardware)
    metrics = list(query.metrics or known_metrics())
    runs = BenchmarkRun.objects.filter(visible_models_q(actor, prefix="model__"))
    if model is not None:
        runs = runs.filter(model=model)
    if hardware is not None:
        runs = runs.filter(hardware=hardware)
    if query.until:
        runs = runs.filter(created_at__lte=query.until)
    if query.dtype:
        runs = runs.filter(result__job__spec__dtype=query.dtype)
    run_rows = list(runs.order_by("created_at", "id").values_list(
        "id", "created_at", "model__slug", "hardware__slug", "result__job_id", "result__job__spec",
        "result__verdict")[:MAX_RUNS + 1])
    if len(run_rows) > MAX_RUNS:
        raise SeriesQueryError("detail", f"more than {MAX_RUNS} benchmark runs match: narrow the query with model, "
                               "hardware or until")
    by_run = {row[0]: row for row in run_rows}
    # a run's ref, shared by its points: (run, job, at, synthetic: seeded evidence, not an agent's)
    refs = {row[0]: (row[0], row[4], row[1].isoformat(), bool((row[5] or {}).get("seeded"))) for row in run_rows}
    # only a run whose bench verdict passed (physics and consistency included) joins later runs' baselines
    baseline = {row[0]: row[6] == "pass" for row in run_rows}
    series: dict[tuple[str, str, Configuration, str], Series] = {}

    def add(run_id: int, concurrency: int, names: list[str], values: Sequence[Any]) -> None:
        run = by_run.get(run_id)
        if run is None:
            return
        _, at, model_slug, hw_slug, job_id, spec, _ = run
        config = _config_of(spec, concurrency)
        for metric, value in zip(names, values, strict=True):
            if value is None:
                continue
            key = (model_slug, hw_slug, config, metric)
            s = series.get(key)
            if s is None:
                s = series[key] = Series(model_slug, hw_slug, config, metric)
            s.points.append(Point(at, float(value), refs[run_id], baseline=baseline[run_id]))

    columns = [m for m in metrics if m not in RUN_METRICS]
    if columns:
        points = BenchmarkPoint.objects.filter(run__in=runs.values("id"))
        if query.concurrency is not None:
            points = points.filter(concurrency=query.concurrency)
        for run_id, concurrency, *values in points.values_list("run_id", "concurrency", *columns):
            add(run_id, concurrency, columns, values)
    from_runs = [m for m in metrics if m in RUN_METRICS]
    if from_runs:  # one more query: each run's section runs (only that key of the section)
        for run_id, section_runs in BenchmarkRun.objects.filter(id__in=runs.values("id")).values_list(
                "id", "result__section__runs"):
            for concurrency, values in run_values(section_runs, from_runs, query.concurrency):
                add(run_id, concurrency, from_runs, values)
    # lengths may be None in one run's configuration and numbers in another's: None sorts first, never compared
    ordered = sorted(series.values(), key=lambda s: (
        s.model, s.hardware, s.metric, s.config.dtype, s.config.concurrency,
        (s.config.input_len is not None, s.config.input_len or 0),
        (s.config.output_len is not None, s.config.output_len or 0)))
    for s in ordered:
        s.points.sort(key=lambda p: (p.at, p.ref[0]))
        if detect:
            flagged = detect_regressions(s.points, metric=s.metric, rule=rule)
            s.regressions = [r for r in flagged if query.since is None or r.at >= query.since]
        if query.since is not None:
            s.points = [p for p in s.points if p.at >= query.since]
    return [s for s in ordered if s.points]


def all_regressions(series: Iterable[Series]) -> list[dict[str, Any]]:
    """Every flagged run of ``series``, newest first."""
    rows = [regression_dict(s, r) for s in series for r in s.regressions]
    rows.sort(key=lambda r: (r["at"], r["model"], r["hardware"], r["metric"]), reverse=True)
    return rows


def csv_rows(series: Sequence[Series]) -> list[dict[str, Any]]:
    """Long-format rows for CSV export: one per series point."""
    flagged = {(id(s), r.ref[0]) for s in series for r in s.regressions}
    return [
        {"model": s.model, "hardware": s.hardware, "dtype": s.config.dtype, "concurrency": s.config.concurrency,
         "input_len": s.config.input_len, "output_len": s.config.output_len, "metric": s.metric, "unit": s.unit,
         "at": p.ref[2], "value": p.value, "run": p.ref[0], "job": p.ref[1],
         "regression": (id(s), p.ref[0]) in flagged, "synthetic": p.ref[3]}
        for s in series for p in s.points
    ]


def cells_with_benchmarks(actor: Actor) -> list[tuple[str, str, str, str]]:
    """(model slug, model name, hardware slug, hardware name) of every visible cell with a benchmark run."""
    rows = (BenchmarkRun.objects.filter(visible_models_q(actor, prefix="model__"))
            .values_list("model__slug", "model__name", "hardware__slug", "hardware__name").distinct()
            .order_by("model__slug", "hardware__slug"))
    return list(rows)


def newest_benchmarked_cell(actor: Actor) -> tuple[str, str] | None:
    row = (BenchmarkRun.objects.filter(visible_models_q(actor, prefix="model__")).order_by("-created_at", "-id")
           .values_list("model__slug", "hardware__slug").first())
    return row


__all__ = ["Configuration", "NotVisible", "Series", "SeriesQuery", "SeriesQueryError", "load_series"]
