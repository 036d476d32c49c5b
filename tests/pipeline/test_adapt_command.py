"""`day0 adapt` end to end on tiny models: tiers, the report's keys (docs/stage-report.md), failures that name the cause."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from agents.runtime.testing.make_model import cached_model
from day0cli.main import main

# docs/stage-report.md, written out here so the test checks the document, not contract.sections' copy of it.
TOP_KEYS = {"model", "hardware", "dtype", "tier", "failed_stage", "error", "stages"}
PLAN_KEYS = {"params_total", "params_active", "weight_bytes", "kv_bytes_per_token", "plan", "fits", "bytes_per_device"}
LOAD_KEYS = {"ok", "tensors", "bytes", "seconds", "gb_per_s", "peak_rss_bytes", "shards", "problems"}
ALIGN_KEYS = {"passed", "thresholds", "layers", "e2e"}
E2E_KEYS = {"prompts", "tokens", "token_match_rate", "divergences", "perplexity_ref", "perplexity_target"}


def _adapt(model: Path, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    report_file = tmp_path / "report.json"
    rc = main(["adapt", str(model), "--hardware", "cpu", "--report", str(report_file), "--quiet", *extra])
    return rc, json.loads(report_file.read_text()) if report_file.exists() else {}


@pytest.mark.parametrize("arch", ["llama", "qwen3-moe"])
def test_adapt_plan_load_align_reaches_tier_2_with_align_passed(arch: str, tmp_path: Path, capsys) -> None:
    rc, report = _adapt(cached_model(arch), tmp_path, "--stages", "plan,load,align")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert TOP_KEYS <= set(report) and {"name", "architecture", "path"} <= set(report["model"])
    assert report["tier"] == 2  # tier 3 and 4 need the serve stage too (tiers.TIER_GATES)
    assert report["failed_stage"] is None and report["error"] is None
    stages = report["stages"]
    assert set(stages) == {"plan", "load", "align"}
    assert PLAN_KEYS <= set(stages["plan"]) and {"tp", "pp", "ep", "devices"} <= set(stages["plan"]["plan"])
    assert LOAD_KEYS <= set(stages["load"]) and stages["load"]["ok"] is True
    align = stages["align"]
    assert ALIGN_KEYS <= set(align) and align["passed"] is True
    assert E2E_KEYS <= set(align["e2e"])
    assert [row["layer"] for row in align["layers"]] == list(range(report_layers(cached_model(arch))))
    assert all(row["cosine"] > 0.9999 for row in align["layers"])  # fp32 on both sides
    assert align["e2e"]["token_match_rate"] == 1.0 and align["e2e"]["tokens"] == 48
    assert "tier 2 (loads)" in out


def report_layers(path: Path) -> int:
    return json.loads((path / "config.json").read_text())["num_hidden_layers"]


def test_a_truncated_shard_fails_load_naming_the_file_and_tensor(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(cached_model("llama"), model)
    shard = model / "model-00002-of-00004.safetensors"
    data = shard.read_bytes()
    header_len = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + header_len])
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    shard.write_bytes(data[:-64])
    rc, report = _adapt(model, tmp_path, "--stages", "plan,load,align")
    assert rc == 1
    assert report["failed_stage"] == "load" and report["tier"] == 1
    assert shard.name in report["error"] and last in report["error"]
    assert "align" not in report["stages"]


def test_a_threshold_override_reaches_align(tmp_path: Path) -> None:
    # fp32 on both sides still differs in the last bits: no error at all is stricter than any run meets
    rc, report = _adapt(cached_model("llama"), tmp_path, "--stages", "load,align", "--threshold", "layer_max_rel_err=0")
    assert rc == 1 and report["failed_stage"] == "align"
    assert report["stages"]["align"]["thresholds"]["layer_max_rel_err"] == 0
    assert "layer 0 max_rel_err" in report["error"]


def test_an_out_of_range_threshold_is_refused_naming_it(tmp_path: Path, capsys) -> None:
    rc, _ = _adapt(cached_model("llama"), tmp_path, "--stages", "load", "--threshold", "layer_cosine=1.01")
    assert rc == 2 and "layer_cosine" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hardware", "no-such-gpu"], "no-such-gpu"),
        (["--hardware", "cpu", "--stages", "plan,serv"], "'serv'"),
        (["--hardware", "cpu", "--threshold", "layer_cosine"], "KEY=VALUE"),
        (["--hardware", "cpu", "--threshold", "layer_cosin=0.9"], "'layer_cosin' is not read by any stage"),
        (["--hardware", "cpu", "--threshold", "layer_cosine=high"], "'high' is not a number"),
        (["--hardware", "cpu", "--tp", "0"], "--tp"),
    ],
)
def test_bad_arguments_exit_2_with_a_message_naming_them(args: list[str], message: str, capsys) -> None:
    assert main(["adapt", str(cached_model("llama")), *args]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_model_directory_is_named(tmp_path: Path, capsys) -> None:
    assert main(["adapt", str(tmp_path / "nope"), "--hardware", "cpu"]) == 2
    assert "nope does not exist" in capsys.readouterr().err


def test_a_config_alone_plans_under_its_file_name_and_cannot_load(tmp_path: Path) -> None:
    config = tmp_path / "tiny-llama.json"
    shutil.copy(cached_model("llama") / "config.json", config)
    rc, report = _adapt(config, tmp_path, "--stages", "plan,load")
    assert rc == 1 and report["model"]["name"] == "tiny-llama"
    assert report["tier"] == 1 and report["failed_stage"] == "load" and "no model directory" in report["error"]
    assert report["started_at"] <= report["finished_at"]
