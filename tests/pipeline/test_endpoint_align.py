"""Endpoint align's planted faults, each a real server process in front of the bundled runtime
(``engine_faults/logprob_proxy.py``) started as a generic command engine: logprobs that change on a
prefix-cache hit fail the KV self-consistency check naming the hit, and logprobs that say nothing of the prompt
fail its perturbed-prompt control (the check cannot see a difference), each naming the check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agents.pipeline.runner import run_pipeline
from agents.runtime.testing.make_model import cached_model
from agents.worker.job_context import build_context
from contract.hardware import get_hardware

REPO = Path(__file__).resolve().parents[2]


def _faulty_engine_ctx(tmp_path: Path, fault: str):
    command = (f"{sys.executable} -m tests.pipeline.engine_faults.logprob_proxy --fault {fault} --port {{port}} -- "
               "{model_path} --dtype {dtype} --device cpu")
    spec = {"job": 1, "model": {"slug": "tiny-llama", "path": str(cached_model("llama"))},
            "hardware": {**get_hardware("cpu").to_dict(), "slug": "cpu"}, "dtype": "float32",
            "engine": {"name": "openai-compatible", "version": "", "command": command},
            "bench": {"ready_timeout": 120}}
    ctx = build_context(1, spec, lambda *a, **k: None)
    ctx.workdir = tmp_path
    return ctx


@pytest.mark.parametrize(("fault", "named"), [
    ("hit", "align: kv_self hit: mean top-k KL"),
    ("blind", "align: kv_self perturbed prompt: mean KL 0 is not above"),
])
def test_a_planted_logprob_fault_fails_endpoint_align_naming_the_check(tmp_path, monkeypatch, fault, named):
    monkeypatch.chdir(REPO)  # the proxy and the server it starts run the checkout's modules
    ctx = _faulty_engine_ctx(tmp_path, fault)
    report = run_pipeline(ctx, ["align"])
    assert report["failed_stage"] == "align" and named in report["error"], report["error"]
    assert report["verdicts"]["align"]["status"] == "fail" and report["tier"] == 0
    kv = {row["case"]: row for row in report["stages"]["align"]["kv_self"]["rows"]}
    assert kv["noop"]["mean_kl"] == 0.0  # the control itself still reads zero: the fault is the engine's
    if fault == "hit":
        assert kv["miss"]["mean_kl"] < 1e-6 < 0.01 < kv["hit"]["mean_kl"]  # only the repeated prompt differs
        assert report["stages"]["align"]["e2e"]["passed"] is True
    assert ctx.state.server is None
