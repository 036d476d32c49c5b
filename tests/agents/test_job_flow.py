"""Jobs through the real chain: REST POST → portal dispatch (Celery, Redis, queue hw.<slug>) → ``day0 agent`` (a
Celery worker without database credentials) → pipeline → events, results and state over REST → the cell."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from django.test import Client

from agents.runtime.testing.make_model import cached_model
from apps.accounts.choices import Scope
from apps.evidence.models import StageResult
from apps.jobs.models import Job, JobEvent
from apps.matrix.models import Cell
from apps.references.models import ReferenceRun, ReferenceState
from tests.agents.conftest import model_config, unique_slug, wait_for
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, UserFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)

FAST_STAGES = ["plan", "load", "inventory", "env"]


@pytest.fixture
def cell(tmp_path: Path) -> SimpleNamespace:
    """A tiny MoE model release, a CPU-like hardware of its own, a submit token and an agent token."""
    model_dir = cached_model("qwen3-moe")
    org = OrganizationFactory(slug=unique_slug("org"))
    model = ModelReleaseFactory(slug=unique_slug("tiny-moe"), organization=org, config=model_config(model_dir))
    hardware = HardwareFactory(slug=unique_slug("hw"), memory_bytes=8 * 10**9, devices_per_node=1,
                               dtypes=["float32", "bfloat16"])
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / model.slug).symlink_to(model_dir)
    submit = make_token(organization=org)
    agent = make_token(organization=org, scopes=[Scope.AGENT], hardware=hardware, name="agent")
    return SimpleNamespace(org=org, model=model, hardware=hardware, submit=submit, agent=agent,
                           models_dir=models_dir)


def submit(portal_url: str, cell: SimpleNamespace, stages: list[str]) -> int:
    response = httpx.post(f"{portal_url}/api/v1/jobs/", headers={"Authorization": f"Token {cell.submit.secret}"},
                          json={"model": cell.model.slug, "hardware": cell.hardware.slug, "stages": stages,
                                "dtype": "float32"}, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def state_of(job_id: int) -> str:
    return Job.objects.get(pk=job_id).state


def assert_event_log_complete(job_id: int, stages: list[str]) -> list[JobEvent]:
    events = list(JobEvent.objects.filter(job_id=job_id).order_by("seq"))
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), "the log is contiguous from 1, each seq once"
    assert Job.objects.get(pk=job_id).events_acked == len(seqs)
    finished = [e.data["stage"] for e in events if e.kind == "stage_finished"]
    assert finished == stages
    return events


def test_job_runs_from_post_to_tier_with_evidence(portal, start_agent, cell) -> None:  # noqa: ANN001
    job_id = submit(portal.url, cell, FAST_STAGES)
    assert state_of(job_id) == "dispatched"  # sent to hw.<slug> on commit, attempt 1
    agent = start_agent(cell.hardware.slug, cell.agent.secret, models_dir=cell.models_dir)
    wait_for(lambda: state_of(job_id) in ("succeeded", "failed"), 240, "the job to finish", agent)
    job = Job.objects.get(pk=job_id)
    assert job.state == "succeeded", (job.failed_stage, job.error, agent.log())
    assert job.attempts == 1 and job.agent is not None and job.agent.hostname == f"host-{cell.hardware.slug}"
    results = {r.stage: r for r in StageResult.objects.filter(job_id=job_id)}
    assert sorted(results) == sorted(FAST_STAGES) and all(r.passed for r in results.values())
    assert results["inventory"].section["summary"]["native"] > 0
    assert results["env"].section["dispatch_key"] == "CPU"
    events = assert_event_log_complete(job_id, FAST_STAGES)
    progress = [e for e in events if e.kind == "progress" and e.stage == "load"]
    assert progress and progress[-1].data["done"] == progress[-1].data["total"]  # tensors loaded of total
    assert Cell.objects.get(model=cell.model, hardware=cell.hardware).tier == 2  # plan + load: "loads"
    # the vendor's terminal view of the finished job: a line per stage, then the tier
    watch = subprocess.run([sys.executable, "-m", "day0cli", "jobs", "watch", str(job_id), "--portal",
                            portal.url, "--token", cell.submit.secret], capture_output=True, text=True, timeout=120)
    assert watch.returncode == 0, watch.stderr
    assert "websocket unavailable" not in watch.stderr  # it followed /ws/jobs/<id>/, not the polling fallback
    lines = watch.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines[:-1]] == FAST_STAGES and all("passed" in line for line in lines[:-1])
    assert lines[-1] == f"job {job_id} succeeded: tier 2 (loads)"


def test_cancel_of_a_queued_job_is_never_run(portal, start_agent, cell) -> None:  # noqa: ANN001
    submitted = subprocess.run([sys.executable, "-m", "day0cli", "jobs", "submit", "--model", cell.model.slug,
                                "--hardware", cell.hardware.slug, "--stages", "plan,load", "--dtype", "float32",
                                "--portal", portal.url, "--token", cell.submit.secret],
                               capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.split()[1])
    assert Job.objects.get(pk=job_id).spec["stages"] == ["plan", "load"]
    headers = {"Authorization": f"Token {cell.submit.secret}"}
    response = httpx.post(f"{portal.url}/api/v1/jobs/{job_id}/cancel/", headers=headers, timeout=30)
    assert response.status_code == 200 and response.json()["state"] == "cancelled", response.text
    # the message is still in hw.<slug>: the agent takes it and must drop it
    second = submit(portal.url, cell, ["plan"])
    agent = start_agent(cell.hardware.slug, cell.agent.secret, models_dir=cell.models_dir)
    wait_for(lambda: state_of(second) == "succeeded", 180, "the job after the cancelled one", agent)
    assert state_of(job_id) == "cancelled"
    assert not JobEvent.objects.filter(job_id=job_id).exists()
    assert not StageResult.objects.filter(job_id=job_id).exists()


def test_cancel_reaches_a_running_agent(portal, start_agent, cell) -> None:  # noqa: ANN001
    stages = ["plan", "load", "inventory", "align", "env"]
    job_id = submit(portal.url, cell, stages)
    agent = start_agent(cell.hardware.slug, cell.agent.secret, models_dir=cell.models_dir)
    wait_for(lambda: JobEvent.objects.filter(job_id=job_id, kind="stage_started", stage="inventory").exists(),
             180, "the inventory stage to start", agent)
    response = httpx.post(f"{portal.url}/api/v1/jobs/{job_id}/cancel/",
                          headers={"Authorization": f"Token {cell.submit.secret}"}, timeout=30)
    assert response.status_code == 200, response.text
    # the agent notices between steps and stops: the cancelled stage is reported, later stages never start
    wait_for(lambda: JobEvent.objects.filter(job_id=job_id, kind="stage_finished", data__error="cancelled").exists(),
             120, "the agent to stop the pipeline", agent)
    assert state_of(job_id) == "cancelled"
    assert not JobEvent.objects.filter(job_id=job_id, kind="stage_started", stage__in=["align", "env"]).exists()
    wait_for(lambda: Job.objects.get(pk=job_id).events_acked == JobEvent.objects.filter(job_id=job_id).count(),
             30, "the last events to be delivered", agent)


@pytest.mark.slow
def test_every_stage_of_a_tiny_model_job_reaches_baselined(portal, start_agent, cell) -> None:  # noqa: ANN001
    # align is scored against the portal's own reference: staff queue the release's reference run on reference
    # hardware, whose agent answers the whole challenge pool with transformers fp32 on the true weights
    reference_hw = HardwareFactory(slug=unique_slug("ref"), memory_bytes=8 * 10**9, devices_per_node=1,
                                   dtypes=["float32", "bfloat16"], reference=True)
    reference_agent = make_token(organization=OrganizationFactory(slug=unique_slug("ref-org")), scopes=[Scope.AGENT],
                                 hardware=reference_hw, name="reference agent")
    staff = Client()
    staff.force_login(UserFactory(is_staff=True))
    queued = staff.post(f"/api/v1/models/{cell.model.slug}/reference/",
                        {"model_path": str(cell.models_dir / cell.model.slug)}, content_type="application/json")
    assert queued.status_code == 201, queued.content
    run_id = queued.json()["id"]
    referee = start_agent(reference_hw.slug, reference_agent.secret, models_dir=cell.models_dir)
    wait_for(lambda: ReferenceRun.objects.get(pk=run_id).state != ReferenceState.QUEUED, 600,
             "the reference run to finish", referee)
    assert ReferenceRun.objects.get(pk=run_id).state == ReferenceState.FINISHED, ReferenceRun.objects.get(pk=run_id).error
    stages = ["plan", "load", "inventory", "align", "serve", "bench", "env"]
    job_id = submit(portal.url, cell, stages)
    agent = start_agent(cell.hardware.slug, cell.agent.secret, models_dir=cell.models_dir)
    wait_for(lambda: state_of(job_id) in ("succeeded", "failed"), 480, "the job to finish", agent)
    job = Job.objects.get(pk=job_id)
    assert job.state == "succeeded", (job.failed_stage, job.error)
    assert sorted(StageResult.objects.filter(job_id=job_id).values_list("stage", flat=True)) == sorted(stages)
    assert_event_log_complete(job_id, stages)
    assert Cell.objects.get(model=cell.model, hardware=cell.hardware).tier == 5


@pytest.mark.slow
def test_killed_agent_job_goes_lost_is_requeued_and_completes(portal, start_agent, portal_worker, cell) -> None:  # noqa: ANN001
    stages = ["plan", "load", "inventory", "align", "env"]
    job_id = submit(portal.url, cell, stages)
    first = start_agent(cell.hardware.slug, cell.agent.secret, models_dir=cell.models_dir)
    wait_for(lambda: JobEvent.objects.filter(job_id=job_id, kind="stage_started", stage="inventory").exists(),
             180, "the inventory stage to start", first)
    before = list(JobEvent.objects.filter(job_id=job_id).order_by("seq").values_list("seq", "kind", "stage"))
    first.kill()
    # the portal's periodic task (beat, every second) sees the silent agent: lost, then re-queued
    portal_worker(DAY0_AGENT_LOST_SECONDS="4")
    wait_for(lambda: Job.objects.get(pk=job_id).attempts == 2, 60, "the job to be re-queued")
    assert state_of(job_id) == "dispatched"
    second = start_agent(cell.hardware.slug, cell.agent.secret, models_dir=cell.models_dir, hostname="other-host",
                         spool_dir=first.spool_dir)
    wait_for(lambda: state_of(job_id) in ("succeeded", "failed"), 300, "the re-run to finish", second)
    assert state_of(job_id) == "succeeded", second.log()
    events = list(JobEvent.objects.filter(job_id=job_id).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kept = [(e.seq, e.kind, e.stage) for e in events[: len(before)]]
    assert kept == before  # events from before the kill are kept once, the re-run continues after them
    assert sum(1 for e in events if e.kind == "stage_finished" and e.data["stage"] == "plan") == 2


@pytest.mark.slow
def test_portal_away_for_10_s_during_a_job_loses_no_event(portal, start_agent, cell) -> None:  # noqa: ANN001
    stages = ["plan", "load", "inventory", "align", "env"]
    job_id = submit(portal.url, cell, stages)
    agent = start_agent(cell.hardware.slug, cell.agent.secret, models_dir=cell.models_dir)
    wait_for(lambda: JobEvent.objects.filter(job_id=job_id, kind="stage_started", stage="inventory").exists(),
             180, "the inventory stage to start", agent)
    portal.stop()
    time.sleep(10)  # the agent keeps working; its events wait in the spool
    portal.start()
    wait_for(lambda: state_of(job_id) in ("succeeded", "failed"), 300, "the job to finish", agent)
    assert state_of(job_id) == "succeeded", agent.log()
    assert_event_log_complete(job_id, stages)
    assert sorted(StageResult.objects.filter(job_id=job_id).values_list("stage", flat=True)) == sorted(stages)
