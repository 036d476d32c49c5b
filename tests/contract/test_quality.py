"""The quality cost of a quantised release (``contract.quality``): task deltas against the original with
Newcombe's bound of a difference of proportions, perplexity without one, malformed rows skipped."""

from __future__ import annotations

import pytest

from contract.quality import difference_interval, quality_cost


def row(task: str, target: float, n: int = 200, metric: str = "accuracy", **extra) -> dict:  # noqa: ANN003
    return {"task": task, "metric": metric, "target": target, "reference": target, "n": n,
            "wilson_low": 0.0 if metric == "accuracy" else None, "higher_is_better": metric == "accuracy", **extra}


def test_newcombe_interval_matches_the_published_example() -> None:
    # Newcombe (1998), Table II example (56/70 - 48/80): method 10 gives 0.0524 to 0.3339
    low, high = difference_interval(56 / 70, 70, 48 / 80, 80)
    assert low == pytest.approx(0.0524, abs=1e-4) and high == pytest.approx(0.3339, abs=1e-4)


def test_a_clear_drop_is_significant_a_small_one_is_within_the_bound() -> None:
    rows = quality_cost([row("arith", 0.60), row("qa", 0.88)], [row("arith", 0.90), row("qa", 0.90)])
    arith, qa = rows
    assert arith["delta"] == pytest.approx(-0.30) and arith["cost"] == pytest.approx(0.30)
    assert arith["high"] < 0 and arith["significant"]
    assert qa["low"] < qa["delta"] < 0 < qa["high"] and not qa["significant"]


def test_perplexity_has_a_delta_and_no_bound_and_lower_is_better() -> None:
    [ppl] = quality_cost([row("wikitext", 13.0, metric="perplexity")], [row("wikitext", 12.0, metric="perplexity")])
    assert ppl["delta"] == pytest.approx(1.0) and ppl["cost"] == pytest.approx(1.0)
    assert ppl["low"] is None and not ppl["significant"] and ppl["higher_is_better"] is False


def test_unmatched_or_malformed_rows_are_skipped() -> None:
    quantised = [row("arith", 0.8), row("only-here", 0.5), row("metric", 0.5, metric="exact_match"),
                 {"task": "nan", "metric": "accuracy", "target": float("nan"), "n": 10}, "junk"]
    original = [row("arith", 0.8), row("metric", 0.5), {"task": "nan", "metric": "accuracy", "target": 0.5, "n": 10}]
    assert [r["task"] for r in quality_cost(quantised, original)] == ["arith"]
