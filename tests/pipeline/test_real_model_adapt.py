"""`day0 adapt` on the real model (SmolLM2-135M-Instruct) through every stage up to eval: tier 6 on the native
path, per-task scores above chance on both sides, the needle grid over lengths and depths. Slow: about 10
minutes on a quiet 2-core host (align and eval each take a few)."""

from __future__ import annotations

import json

import pytest

from day0cli.main import main
from tests.real_model_fixtures import smollm2  # noqa: F401 - the session fixture

STAGES = "plan,load,inventory,align,serve,bench,eval,env"


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_day0_adapt_takes_smollm2_to_tier_6_on_the_native_path(smollm2, tmp_path, capsys) -> None:  # noqa: F811
    report_file = tmp_path / "report.json"
    rc = main(["adapt", str(smollm2), "--hardware", "cpu", "--stages", STAGES, "--report", str(report_file),
               "--workdir", str(tmp_path / "work"), "--quiet"])
    report = json.loads(report_file.read_text())
    assert rc == 0 and report["failed_stage"] is None, (report["failed_stage"], report["error"])
    assert report["tier"] == 6 and report["model"]["path"] == "native"
    rows = {row["task"]: row for row in report["stages"]["eval"]["tasks"]}
    assert set(rows) == {"day0_mc", "day0_qa", "day0_ppl", "needle"}
    for name in ("day0_mc", "day0_qa", "needle"):
        assert rows[name]["reference"] > rows[name]["chance"] and rows[name]["target"] > rows[name]["chance"], name
    assert rows["day0_mc"]["n"] >= 200 and rows["day0_mc"]["wilson_low"] > 0.25
    needle = report["stages"]["eval"]["needle"]
    assert needle["lengths"] == [256, 512, 1024] and needle["depths"] == [0, 25, 50, 75, 100]
    assert len(needle["target"]) == 3 and all(len(row) == 5 for row in needle["target"])
    assert "tier 6 (validated)" in capsys.readouterr().out
