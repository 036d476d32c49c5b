"""The runtime's own command line (``python -m agents.runtime``): its commands run without the Django project,
``day0`` registers the same ones in the same place, and the pipeline starts its servers through it (one function
builds that command)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.server_process import ServerProcess
from agents.runtime.commands.serve import serve_command
from day0cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def test_day0_keeps_its_commands_in_order_the_runtime_ones_delegated() -> None:
    assert _subcommands(build_parser()) == ["demo", "estimate", "make-model", "serve", "bench", "adapt", "manifest",
                                            "agent", "jobs"]


def test_the_runtime_module_runs_its_commands_alone() -> None:
    done = _run("-m", "agents.runtime", "--help")
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^ {4}(\S+)", done.stdout, re.MULTILINE)
    assert listed == ["estimate", "make-model", "serve", "bench"], done.stdout


def test_the_runtime_estimate_matches_day0_and_loads_no_django(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "llama-3.1-8b", "--hardware", "nvidia-h100-sxm", "--json"]
    probe = ("import json, sys\nfrom agents.runtime.commands import main\ncode = main(sys.argv[1:])\n"
             "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'django', 'day0portal', 'apps'})\n"
             "print(json.dumps({'code': code, 'loaded': loaded}), file=sys.stderr)")
    done = _run("-c", probe, *argv)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"code": 0, "loaded": []}, done.stderr
    assert main(argv) == 0
    assert json.loads(done.stdout) == json.loads(capsys.readouterr().out)


def test_one_function_builds_the_serve_command() -> None:
    assert serve_command(Path("/m"), dtype="bfloat16", device="cpu", port=8123, args=["--tp", 2, "--pp", "2"]) == [
        sys.executable, "-m", "agents.runtime", "serve", "/m", "--port", "8123", "--dtype", "bfloat16",
        "--device", "cpu", "--tp", "2", "--pp", "2"]
    assert "--port" not in serve_command("/m", dtype="float32", device="cpu")


def test_the_serve_stage_starts_the_runtime_module_not_the_django_project(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, dtype="float32", device="cpu", tp=2, log_path=tmp_path / "serve.log",
                           extra_args=["--max-num-seqs", "4"], layout_args=("--pp", "1"))
    with server:
        assert server.proc.args == [sys.executable, "-m", "agents.runtime", "serve", str(tmp_path), "--port",
                                    str(server.port), "--dtype", "float32", "--device", "cpu", "--tp", "2",
                                    "--max-num-seqs", "4", "--pp", "1"]
        with pytest.raises(StageFailed, match="is not a model directory"):  # the runtime's serve command answered
            server.wait_ready(60)
    assert server.proc.returncode == 2


def test_a_following_node_starts_its_serve_ranks_through_the_same_builder() -> None:
    from types import SimpleNamespace

    from agents.pipeline.support.nodes import serve_command as follower_command
    from agents.runtime.nodes import NodeSpec

    ctx = SimpleNamespace(model_dir=Path("/m"), dtype="float32", device="cpu", bench={"serve_args": ["--num-blocks", 32]},
                          node=NodeSpec(2, 1, "10.0.0.1", 29500, 120))
    assert follower_command(ctx, 2, 1, 2) == serve_command(
        "/m", dtype="float32", device="cpu",
        args=["--tp", "2", "--pp", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
              "--master-port", "29501", "--rendezvous-timeout", "120", "--num-blocks", "32"])
