"""The regression rule: noise-aware, direction-aware, relative-change-gated (no database)."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest

from apps.benchmarks.regressions import (
    Direction,
    Point,
    RegressionRule,
    detect_regressions,
    known_metrics,
    metric_direction,
    robust_spread,
)

START = datetime(2026, 1, 1, tzinfo=UTC)


def series(values: list[float]) -> list[Point]:
    return [Point(START + timedelta(days=i), v, ref=i) for i, v in enumerate(values)]


def noisy(n: int, center: float, rel_sigma: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.gauss(0, rel_sigma)) for _ in range(n)]


def test_a_latency_step_of_fifty_percent_is_flagged_at_the_step():
    values = noisy(60, 100.0, 0.03) + [150.0] + noisy(5, 100.0, 0.03, seed=1)
    flags = detect_regressions(series(values), metric="ttft_ms_p50")
    assert [f.ref for f in flags] == [60]
    flag = flags[0]
    assert flag.direction is Direction.LOWER_IS_BETTER
    assert flag.ratio == pytest.approx(1.5, rel=0.05)
    assert flag.z > 3
    assert flag.baseline_runs == RegressionRule().lookback


def test_a_throughput_drop_is_flagged_but_a_throughput_jump_is_not():
    base = noisy(30, 1000.0, 0.02)
    drop = detect_regressions(series(base + [600.0]), metric="output_tok_s")
    jump = detect_regressions(series(base + [1600.0]), metric="output_tok_s")
    assert [f.ref for f in drop] == [30]
    assert drop[0].ratio == pytest.approx(0.6, rel=0.05)
    assert jump == []


def test_a_latency_improvement_is_not_a_regression():
    assert detect_regressions(series(noisy(30, 100.0, 0.02) + [50.0]), metric="tpot_ms_p90") == []


def test_noise_alone_raises_no_flag_over_a_year_of_runs():
    values = noisy(365, 80.0, 0.05, seed=7)
    assert detect_regressions(series(values), metric="itl_ms_p99") == []


def test_a_large_relative_change_inside_a_noisy_history_is_not_flagged():
    # History swings ±40 %: a 1.3x value is material but not unusual for this series.
    rng = random.Random(3)
    values = [100.0 * (1 + rng.uniform(-0.4, 0.4)) for _ in range(30)] + [130.0]
    assert detect_regressions(series(values), metric="e2e_ms_mean") == []


def test_an_unusual_but_small_change_in_a_flat_history_is_not_flagged():
    # A perfectly flat history has zero MAD; the floor keeps 1.1x from being "infinitely unusual",
    # and the 1.2x minimum relative change keeps it from being flagged at all.
    values = [100.0] * 20 + [110.0]
    assert detect_regressions(series(values), metric="ttft_ms_p50") == []
    flags = detect_regressions(series([100.0] * 20 + [125.0]), metric="ttft_ms_p50")
    assert [f.ref for f in flags] == [20]
    assert math.isfinite(flags[0].z)


def test_ratio_thresholds_are_configurable():
    values = noisy(30, 100.0, 0.01) + [115.0]
    assert detect_regressions(series(values), metric="ttft_ms_p50") == []
    strict = RegressionRule(latency_ratio=1.1)
    assert [f.ref for f in detect_regressions(series(values), metric="ttft_ms_p50", rule=strict)] == [30]


def test_the_baseline_looks_back_only_n_runs_and_a_persistent_step_becomes_the_new_normal():
    rule = RegressionRule(lookback=10, min_history=5)
    values = noisy(20, 100.0, 0.02) + noisy(20, 200.0, 0.02, seed=2)
    flags = detect_regressions(series(values), metric="ttft_ms_p50", rule=rule)
    refs = [f.ref for f in flags]
    assert refs[0] == 20
    assert all(20 <= r < 26 for r in refs)  # flagged until the step holds half the window


def test_too_little_history_is_never_flagged():
    assert detect_regressions(series([100.0, 100.0, 100.0, 500.0]), metric="ttft_ms_p50") == []


def test_points_are_taken_in_time_order():
    points = series(noisy(30, 100.0, 0.02) + [170.0])
    flags = detect_regressions(list(reversed(points)), metric="ttft_ms_p50")
    assert [f.ref for f in flags] == [30]


def test_a_non_finite_value_is_refused_with_its_time():
    points = series([100.0] * 10 + [float("nan")])
    with pytest.raises(ValueError, match=r"ttft_ms_p50 at 2026-01-11.*not a finite number"):
        detect_regressions(points, metric="ttft_ms_p50")


def test_directions_of_known_metrics():
    assert metric_direction("output_tok_s") is Direction.HIGHER_IS_BETTER
    assert metric_direction("req_s") is Direction.HIGHER_IS_BETTER
    assert metric_direction("ttft_ms_p99") is Direction.LOWER_IS_BETTER
    assert metric_direction("peak_memory_bytes") is Direction.LOWER_IS_BETTER
    assert all(metric_direction(m) for m in known_metrics())
    with pytest.raises(ValueError, match="unknown benchmark metric 'tokens_per_watt'"):
        metric_direction("tokens_per_watt")


def test_robust_spread_ignores_one_outlier_and_has_a_floor():
    assert robust_spread([10, 10, 10, 10, 1000], 10, 0.0) == pytest.approx(1e-12)
    assert robust_spread([10, 10, 10, 10, 1000], 10, 0.05) == pytest.approx(0.5)
    assert robust_spread([9, 10, 11], 10, 0.0) == pytest.approx(1.4826)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"lookback": "x"}, "lookback must be an integer, got 'x'"),
        ({"z_threshold": "nan"}, "z_threshold must be finite"),
        ({"lookback": "1"}, "lookback must be at least 2"),
        ({"latency_ratio": "0.9"}, "latency_ratio must be above 1"),
        ({"throughput_ratio": "1.5"}, "throughput_ratio must be between 0 and 1"),
        ({"lookback": "10", "min_history": "20"}, "min_history must be between 2 and lookback"),
    ],
)
def test_bad_rule_parameters_name_the_parameter(params, message):
    with pytest.raises(ValueError, match=message):
        RegressionRule.from_params(params)


def test_rule_from_params_keeps_defaults_and_clamps_min_history_to_a_short_lookback():
    assert RegressionRule.from_params({}) == RegressionRule()
    rule = RegressionRule.from_params({"lookback": "3", "latency_ratio": "1.5"})
    assert (rule.lookback, rule.min_history, rule.latency_ratio) == (3, 3, 1.5)


def test_a_run_that_failed_its_verdict_never_joins_a_baseline() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    values = [100.0] * 10 + [1e9] * 10 + [100.0]  # ten forged runs at 1e9 tok/s, then an honest one
    points = [Point(start + timedelta(days=i), x, ref=i, baseline=x < 1e9) for i, x in enumerate(values)]
    assert detect_regressions(points, metric="output_tok_s") == []  # the honest run is judged against 100s
    poisoned = [Point(p.at, p.value, p.ref) for p in points]
    assert [r.ref for r in detect_regressions(poisoned, metric="output_tok_s")] == [20]
