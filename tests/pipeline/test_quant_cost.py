"""The quantisation's own cost end to end: a ``make-model --quant`` release through plan, load and align beside its
original (``DIR/original``) gets the align section's ``e2e_original`` block; a coarse format costs tokens or KL, the
control (the original against itself, ``--original``) is exact. The block is informational (align still passes)
and is bounded by ``contract.quant_cost``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.quant_cost import problems
from contract.sections import type_problems
from day0cli.main import main


def _adapt(tmp_path: Path, release: Path, *extra: str) -> dict:
    report_file = tmp_path / f"report-{release.name}.json"
    rc = main(["adapt", str(release), "--hardware", "cpu", "--stages", "plan,load,align", "--report",
               str(report_file), "--quiet", *extra])
    report = json.loads(report_file.read_text())
    assert rc == 0 and report["failed_stage"] is None, report.get("error")
    return report["stages"]["align"]


@pytest.fixture(scope="module")
def int4_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("quant") / "int4"
    assert main(["make-model", "--arch", "llama", "--quant", "int4-ct", "--out", str(out)]) == 0
    return out


def test_a_coarse_release_reports_its_cost_against_the_original(int4_release: Path, tmp_path: Path) -> None:
    align = _adapt(tmp_path, int4_release)
    cost = align["e2e_original"]
    assert "error" not in cost, cost.get("error")
    assert align["passed"] and align["e2e"]["token_match_rate"] == 1.0  # the kernel against the dequantised numbers
    assert cost["original"] == "original" and cost["informational"] is True
    assert cost["tokens"] > 0 and cost["prompts"] == 3
    assert cost["token_match_rate"] < 1 or cost["kl_mean"] > 1e-6  # INT4 groups change the numbers
    assert cost["kl_max"] >= cost["kl_mean"] > 0 and cost["topk_kl_mean"] > 0
    assert cost["perplexity_target"] != pytest.approx(cost["perplexity_original"], rel=1e-6)
    assert type_problems("align", align) == [] and problems(cost) == []


def test_the_original_against_itself_is_exact(int4_release: Path, tmp_path: Path) -> None:
    original = int4_release / "original"
    align = _adapt(tmp_path, original, "--original", str(original))
    cost = align["e2e_original"]
    assert "error" not in cost, cost.get("error")
    assert cost["token_match_rate"] == 1.0 and cost["exact"]
    assert cost["kl_max"] < 1e-6 and cost["topk_kl_max"] < 1e-6
    assert cost["perplexity_rel_diff"] == pytest.approx(0, abs=1e-5)


def test_an_unquantised_release_without_an_original_has_no_block(int4_release: Path, tmp_path: Path) -> None:
    assert "e2e_original" not in _adapt(tmp_path, int4_release / "original")


def test_the_bounds_name_the_bad_value() -> None:
    good = {"prompts": 3, "tokens": 48, "top_k": 10, "token_match_rate": 0.9, "kl_mean": 0.01, "kl_max": 0.1,
            "perplexity_original": 12.0, "perplexity_target": 12.5, "first_divergence": [3, None, 0]}
    assert problems(good) == []
    assert problems({**good, "token_match_rate": 1.4}) == [
        ("stages.align.e2e_original.token_match_rate", "1.4 is out of range: must be from 0 to 1")]
    assert problems({**good, "kl_mean": -0.5})[0][0].endswith(".kl_mean")
    assert problems({**good, "first_divergence": ["x"]})[0][0].endswith(".first_divergence")
    assert problems({**good, "exact": True})[0][0].endswith(".exact")
    assert type_problems("align", {"e2e_original": {"tokens": "many"}}) == [
        ("stages.align.e2e_original.tokens", "must be an integer, got str")]
    assert type_problems("align", {"e2e_original": []}) == [("stages.align.e2e_original", "must be an object")]
