"""report.py: the whole report's key checks and JSON safety."""

from __future__ import annotations

import json
import math

import torch

from agents.pipeline.support.report import json_safe, report_problems


def test_json_safe_drops_non_finite_numbers_and_converts_containers() -> None:
    value = {"a": math.nan, "b": (1, 2.5, math.inf), "c": torch.tensor(3.5), "d": {"x"}, 4: None}
    safe = json_safe(value)
    assert safe == {"a": None, "b": [1, 2.5, None], "c": 3.5, "d": ["x"], "4": None}
    json.dumps(safe, allow_nan=False)


def test_report_problems_checks_top_level_model_and_tier() -> None:
    report = {"model": {"name": "m"}, "hardware": "cpu", "dtype": "float32", "tier": 9, "failed_stage": None,
              "stages": {}}
    problems = report_problems(report)
    assert "error" in problems and "model.architecture" in problems and "model.path" in problems
    assert any(p.startswith("tier") for p in problems)
