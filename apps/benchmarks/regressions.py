"""Noise-aware regression detection for benchmark series (pure Python, no Django).

A run is a regression when, against the last ``lookback`` runs of the same model, hardware and
configuration, it is both *unusual* and *material*:

* unusual: its robust z-score, ``(value - median) / spread`` signed so that positive means worse, is at
  least ``z_threshold``. The spread is the MAD scaled to a normal sigma (×1.4826), floored at
  ``spread_floor`` × |median| so that a near-constant history does not turn jitter into alarms;
* material: its ratio to the baseline median passes the metric's relative limit — above
  ``latency_ratio`` (default 1.2×) for lower-is-better metrics, below ``throughput_ratio`` (default 0.8×)
  for higher-is-better ones.

The baseline of each run holds only the runs before it, so a persistent step is flagged until it becomes
the new median (about ``lookback / 2`` runs later): a regression that nobody fixed becomes the new normal.
A point marked ``baseline=False`` (a run whose bench verdict is not a pass: numbers that fail physics or
consistency) is judged against the baseline but never joins it.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

MAD_TO_SIGMA = 1.4826


class ParameterError(ValueError):
    """A bad detector or query parameter; ``param`` names it (the API answers ``{param: [message]}``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class Direction(StrEnum):
    """Which way a metric gets better."""

    LOWER_IS_BETTER = "lower_is_better"
    HIGHER_IS_BETTER = "higher_is_better"


# Metric names as stored per benchmark row (a latency family expands to its percentiles: ttft_ms_p50, ...).
LATENCY_FAMILIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
THROUGHPUT_METRICS = ("output_tok_s", "req_s")
MEMORY_METRICS = ("peak_memory_bytes",)
# Read from each run of the bench section's JSON rather than a column (``run_metrics``): lower is better for all
RUN_METRICS = ("comm_overhead_ratio", "comm_overhead_ratio_max", "tpot_jitter", "expert_max_over_mean",
               "expert_ep_max_over_mean")


def metric_direction(metric: str) -> Direction:
    """The direction of a metric name such as ``ttft_ms_p90``, ``output_tok_s`` or ``peak_memory_bytes``."""
    if metric in THROUGHPUT_METRICS:
        return Direction.HIGHER_IS_BETTER
    if metric in MEMORY_METRICS or metric in RUN_METRICS or any(metric == f or metric.startswith(f + "_") for f in LATENCY_FAMILIES):
        return Direction.LOWER_IS_BETTER
    raise ValueError(f"unknown benchmark metric {metric!r}: expected one of {', '.join(known_metrics())}")


def known_metrics() -> list[str]:
    """Every metric name the detector knows a direction for."""
    names = [f"{family}_{stat}" for family in LATENCY_FAMILIES for stat in ("mean", "p50", "p90", "p99")]
    return names + list(THROUGHPUT_METRICS) + list(MEMORY_METRICS) + list(RUN_METRICS)


@dataclass(frozen=True)
class RegressionRule:
    """Parameters of the detector; checks its invariants on construction."""

    lookback: int = 14
    min_history: int = 5
    z_threshold: float = 3.0
    latency_ratio: float = 1.2
    throughput_ratio: float = 0.8
    spread_floor: float = 0.02

    def __post_init__(self) -> None:
        if self.lookback < 2:
            raise ParameterError("lookback", f"lookback must be at least 2 runs, got {self.lookback}")
        if not 2 <= self.min_history <= self.lookback:
            raise ParameterError("min_history", f"min_history must be between 2 and lookback ({self.lookback}), got {self.min_history}")
        if not self.z_threshold > 0:
            raise ParameterError("z_threshold", f"z_threshold must be positive, got {self.z_threshold}")
        if not self.latency_ratio > 1:
            raise ParameterError("latency_ratio", f"latency_ratio must be above 1, got {self.latency_ratio}")
        if not 0 < self.throughput_ratio < 1:
            raise ParameterError("throughput_ratio", f"throughput_ratio must be between 0 and 1, got {self.throughput_ratio}")
        if not self.spread_floor >= 0:
            raise ParameterError("spread_floor", f"spread_floor must be non-negative, got {self.spread_floor}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RegressionRule:
        """Builds a rule from query parameters (strings), naming the parameter that is not a number."""
        kwargs: dict[str, Any] = {}
        for name, kind in (
            ("lookback", int),
            ("min_history", int),
            ("z_threshold", float),
            ("latency_ratio", float),
            ("throughput_ratio", float),
            ("spread_floor", float),
        ):
            raw = params.get(name)
            if raw in (None, ""):
                continue
            try:
                value = kind(raw)
            except (TypeError, ValueError):
                raise ParameterError(name, f"{name} must be {'an integer' if kind is int else 'a number'}, "
                                            f"got {raw!r}") from None
            if kind is float and not math.isfinite(value):
                raise ParameterError(name, f"{name} must be finite, got {raw!r}")
            kwargs[name] = value
        if "min_history" not in kwargs and "lookback" in kwargs:
            kwargs["min_history"] = min(cls.min_history, kwargs["lookback"])
        return cls(**kwargs)


@dataclass(frozen=True)
class Point:
    """One run's value of one metric."""

    at: datetime
    value: float
    ref: Any = None  # what the caller wants back with a flag (a run id, a row)
    baseline: bool = True  # False: never part of a later run's baseline (its bench verdict is not a pass)


@dataclass(frozen=True)
class Regression:
    """A flagged run: how far it is from its baseline, in ratio and robust sigmas."""

    metric: str
    direction: Direction
    at: datetime
    value: float
    baseline_median: float
    baseline_spread: float
    baseline_runs: int
    ratio: float
    z: float
    ref: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "direction": str(self.direction),
            "at": self.at.isoformat(),
            "value": self.value,
            "baseline_median": self.baseline_median,
            "baseline_spread": self.baseline_spread,
            "baseline_runs": self.baseline_runs,
            "ratio": round(self.ratio, 4),
            "z": round(self.z, 2),
        }


def _median_of_sorted(xs: Sequence[float]) -> float:
    n = len(xs)
    mid = n // 2
    return xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2


def robust_spread(values: Sequence[float], center: float, floor: float) -> float:
    """MAD scaled to sigma, at least ``floor`` × |center| (and never zero when center is zero)."""
    mad = _median_of_sorted(sorted(abs(v - center) for v in values)) * MAD_TO_SIGMA
    return max(mad, floor * abs(center), 1e-12)


def detect_regressions(
    points: Iterable[Point],
    *,
    metric: str,
    rule: RegressionRule | None = None,
    direction: Direction | None = None,
) -> list[Regression]:
    """Flags the runs of one series (one model, hardware, configuration and metric) that regressed.

    ``points`` need not be sorted; they are taken in time order. A non-finite value raises ``ValueError``
    naming the run's time. The baseline window is kept sorted as it slides (insert one, drop one), and the
    spread is computed only for runs whose relative change is material, so a year of runs costs little.
    """
    rule = rule or RegressionRule()
    direction = direction or metric_direction(metric)
    lower_is_better = direction is Direction.LOWER_IS_BETTER
    ordered = sorted(points, key=lambda p: p.at)
    for p in ordered:
        if not math.isfinite(p.value):
            raise ValueError(f"{metric} at {p.at.isoformat()} is not a finite number: {p.value!r}")
    flagged: list[Regression] = []
    window: list[float] = []  # sorted: the last ``lookback`` baseline values before the run being judged
    kept: deque[float] = deque()  # the same values in time order, to drop the oldest
    for point in ordered:
        value = point.value
        center = _median_of_sorted(window) if len(window) >= rule.min_history else 0.0
        if center > 0:  # a relative change has no meaning against a zero or negative (or too short) baseline
            ratio = value / center
            material = ratio > rule.latency_ratio if lower_is_better else ratio < rule.throughput_ratio
            if material:
                spread = robust_spread(window, center, rule.spread_floor)
                z = (value - center if lower_is_better else center - value) / spread
                if z >= rule.z_threshold:
                    flagged.append(Regression(metric, direction, point.at, value, center, spread, len(window),
                                              ratio, z, point.ref))
        if point.baseline:
            insort(window, value)
            kept.append(value)
            if len(kept) > rule.lookback:
                del window[bisect_left(window, kept.popleft())]
    return flagged
