"""`day0 adapt --compile` is a job's ``bench.compile: true``: the flag reaches the stages through the same
``StageContext.bench`` the worker fills from a job's spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.runtime.testing.make_model import cached_model
from day0cli.main import main


def _adapt(tmp_path: Path, model: Path, *extra: str) -> dict:
    report_file = tmp_path / "report.json"
    rc = main(["adapt", str(model), "--hardware", "cpu", "--report", str(report_file), "--quiet", *extra])
    report = json.loads(report_file.read_text())
    assert rc == 0, report.get("error")
    return report


def test_adapt_compile_reaches_align_which_says_why_a_fallback_model_runs_eager(tmp_path: Path) -> None:
    # a fallback model keeps this cheap: align records the request and the reason instead of compiling
    model = cached_model("qwen2-vl")
    report = _adapt(tmp_path, model, "--stages", "plan,load,align", "--compile")
    block = report["stages"]["align"]["compile"]
    assert block["requested"] is True and block["enabled"] is False and "fallback" in block["reason"]
    assert report["stages"]["align"]["passed"] is True


def test_adapt_without_compile_asks_nothing_of_the_compiled_path(tmp_path: Path) -> None:
    report = _adapt(tmp_path, cached_model("qwen2-vl"), "--stages", "plan,load,align")
    assert "compile" not in report["stages"]["align"]


@pytest.mark.slow
def test_adapt_compile_on_a_native_model_compares_compiled_and_eager_tokens(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DAY0_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    report = _adapt(tmp_path, cached_model("llama"), "--stages", "plan,load,align", "--compile")
    block = report["stages"]["align"]["compile"]
    assert block["enabled"] is True and block["equal"] and block["passed"], block
