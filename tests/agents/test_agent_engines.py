"""What an agent advertises as the engines it can start, and ``day0 adapt --engine``'s checks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from agents.runtime.testing.make_model import cached_model
from agents.worker.engines import discover_engines, parse_engine_args
from day0cli.main import main


def test_an_engine_on_path_and_one_configured_are_advertised(tmp_path: Path, monkeypatch) -> None:
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\necho 0.32.0\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DAY0_AGENT_ENGINES", "sglang=/opt/sglang/bin/sglang")
    assert discover_engines(["mine=/usr/local/bin/mine"]) == {
        "vllm": str(exe), "sglang": "/opt/sglang/bin/sglang", "mine": "/usr/local/bin/mine"}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("DAY0_AGENT_ENGINES")
    assert discover_engines() == {}


def test_a_malformed_engine_argument_is_named() -> None:
    with pytest.raises(ValueError, match="--engine takes NAME=PATH, got 'vllm'"):
        parse_engine_args(["vllm"])


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "vllm"], "needs --engine-command"),
    (["--engine-command", "x {port}"], "--engine-command needs --engine"),
    (["--engine", "x", "--engine-command", "run {model}"], "unknown placeholder {model}"),
])
def test_adapt_engine_arguments_are_checked(args: list[str], message: str, capsys) -> None:
    assert main(["adapt", str(cached_model("llama")), "--hardware", "cpu", *args]) == 2
    assert message in capsys.readouterr().err


def test_adapt_serves_through_an_engine_command(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    command = f"{sys.executable} -m agents.runtime serve {{model_path}} --port {{port}} --dtype {{dtype}} --device cpu"
    report = tmp_path / "report.json"
    rc = main(["adapt", str(cached_model("llama")), "--hardware", "cpu", "--stages", "inventory,serve", "--quiet",
               "--engine", "openai-compatible", "--engine-command", command, "--report", str(report),
               "--workdir", str(tmp_path)])
    data = json.loads(report.read_text())
    assert rc == 0, data["error"]
    assert data["stages"]["inventory"]["applicable"] is False and data["verdicts"]["inventory"]["not_applicable"]
    assert data["stages"]["serve"]["engine"]["name"] == "openai-compatible" and data["tier"] == 0
