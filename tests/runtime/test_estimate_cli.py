"""`day0 estimate` through the real CLI entry point, in process and once as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.hardware import find_config
from day0cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_json_prints_the_plan_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "llama-3.1-8b", "--hardware", "nvidia-h100-sxm", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plan"] == {"tp": 1, "pp": 1, "ep": 1, "devices": 1, "nodes": 1}
    assert report["params_total"] == 8_030_261_248 and report["kv_bytes_per_token"] == 131_072


def test_human_table_from_a_config_file_and_a_model_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(find_config("mixtral-8x7b")))
    assert main(["estimate", str(tmp_path / "config.json"), "--memory-gb", "80", "--dtype", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "MixtralForCausalLM" in out and "46.703 B total" in out and "fits" in out and "candidates" in out
    assert main(["estimate", str(tmp_path), "--memory-gb", "80", "--devices-per-node", "4"]) == 0
    assert "4 per node" in capsys.readouterr().out


def test_does_not_fit_exits_1_with_the_shortfall(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "deepseek-v3", "--memory-gb", "24", "--max-nodes", "1"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "short by" in out


@pytest.mark.parametrize("argv,needle", [
    (["estimate", "no-such-model", "--hardware", "cpu"], "'no-such-model'"),
    (["estimate", "llama-3.1-8b", "--hardware", "no-such-chip"], "'no-such-chip'"),
    (["estimate", "llama-3.1-8b", "--memory-gb", "-1"], "--memory-gb"),
    (["estimate", "llama-3.1-8b", "--memory-gb", "80", "--dtype", "int3"], "'int3'"),
    (["estimate", "llama-3.1-8b", "--memory-gb", "80", "--tp", "0"], "--tp"),
])
def test_bad_input_exits_2_naming_it(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_bad_config_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    assert main(["estimate", str(bad), "--memory-gb", "80"]) == 2
    assert "num_hidden_layers" in capsys.readouterr().err


def test_hardware_and_memory_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        main(["estimate", "llama-3.1-8b", "--hardware", "cpu", "--memory-gb", "8"])


def test_three_trillion_parameter_moe_as_a_subprocess() -> None:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "day0cli", "estimate", "synthetic-3t-moe", "--hardware",
                           "nvidia-h200", "--dtype", "fp8", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["params_total"] > 3e12 and report["fits"]
    assert wall < 20  # the measured figure (≈0.3 s here) is in benchmarks/planner_speed.py; CPUs are shared
