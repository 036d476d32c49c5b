"""The runs of the agent's task (``agents.worker.runs``), in this process against a real portal: a job run claims
the job, runs the pipeline and reports it; a failure outside the pipeline fails the job naming it; a refused claim
drops the delivery; either way the agent's current job is cleared and the job's spool files are released."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.worker.agent_state import STATE
from agents.worker.client import PortalClient
from agents.worker.runs import JobRun, NodeRun
from agents.worker.tasks import run_job_task
from apps.evidence.models import StageResult
from apps.jobs.dispatch import task_payload
from apps.jobs.models import Job, JobEvent
from tests.agents.test_job_flow import cell, submit  # noqa: F401 - a tiny MoE release, its hardware and tokens

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(portal, cell, tmp_path: Path, monkeypatch) -> SimpleNamespace:  # noqa: ANN001, F811
    """This process as the cell's agent: the portal's URL, the agent token, folders of its own."""
    for name, value in (("portal_url", portal.url), ("token", cell.agent.secret), ("hardware", cell.hardware.slug),
                        ("hostname", "runs-test"), ("models_dir", str(cell.models_dir)), ("device", "cpu"),
                        ("spool_root", str(tmp_path / "spool")), ("work_root", str(tmp_path / "work")),
                        ("current_job", None), ("cancel_event", None)):
        monkeypatch.setattr(STATE, name, value)
    with PortalClient(STATE.portal_url, STATE.token) as client:  # a claim names the registered agent
        registered = client.register_agent(hostname=STATE.hostname, capabilities={"device": "cpu"}, versions={})
    monkeypatch.setattr(STATE, "agent_id", int(registered["id"]))
    return SimpleNamespace(portal=portal, cell=cell)


def delivery(agent: SimpleNamespace, stages: list[str]) -> tuple[int, dict, dict]:
    """A job submitted over REST, as the agent receives it: (id, the job as the portal answers it, the spec)."""
    job_id = submit(agent.portal.url, agent.cell, stages)
    with PortalClient(STATE.portal_url, STATE.token) as client:
        job = client.get_job(job_id)
    return job_id, job, task_payload(Job.objects.get(pk=job_id))


def job_files(folder: Path, job_id: int) -> list[str]:
    return sorted(p.name for p in folder.glob(f"job-{job_id}.*")) if folder.is_dir() else []


def test_a_job_run_claims_runs_and_reports_the_job_then_releases_its_files(agent) -> None:  # noqa: ANN001
    job_id, job, spec = delivery(agent, ["plan"])
    summary = JobRun(run_job_task, PortalClient(STATE.portal_url, STATE.token), job_id, job, spec).run()
    assert summary == {"job": job_id, "tier": 1, "failed_stage": None}
    row = Job.objects.get(pk=job_id)
    assert (row.state, row.attempts) == ("succeeded", 1)
    assert StageResult.objects.get(job_id=job_id, stage="plan").passed
    events = list(JobEvent.objects.filter(job_id=job_id).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)) and row.events_acked == len(events)
    assert events[0].message == f"agent runs-test runs job {job_id} (attempt 1) on cpu"
    assert [e.data["stage"] for e in events if e.kind == "stage_finished"] == ["plan"]
    assert STATE.current_job is None and STATE.cancel_event is None
    assert job_files(STATE.spool_dir, job_id) == []  # delivered, then released


def test_a_failure_outside_the_pipeline_fails_the_job_naming_it(agent) -> None:  # noqa: ANN001
    job_id, job, spec = delivery(agent, ["plan"])
    spec = {**spec, "model": {"slug": "not-on-this-host", "config": None}}  # no files here, no config
    summary = JobRun(run_job_task, PortalClient(STATE.portal_url, STATE.token), job_id, job, spec).run()
    assert summary == {"job": job_id, "tier": 0, "failed_stage": "agent"}
    row = Job.objects.get(pk=job_id)
    why = f"ValueError: job {job_id}: no model files and no config in the job spec"
    assert (row.state, row.failed_stage, row.error) == ("failed", "agent", why)
    assert JobEvent.objects.filter(job_id=job_id, level="error", message=why).exists()
    assert STATE.current_job is None and job_files(STATE.spool_dir, job_id) == []


def test_a_refused_claim_drops_the_delivery_and_leaves_nothing_behind(agent) -> None:  # noqa: ANN001
    job_id, job, spec = delivery(agent, ["plan"])
    stale = {**spec, "attempt": spec["attempt"] + 1}  # the portal is at another attempt: not this delivery's job
    assert JobRun(run_job_task, PortalClient(STATE.portal_url, STATE.token), job_id, job, stale).run() is None
    assert Job.objects.get(pk=job_id).state == "dispatched" and not JobEvent.objects.filter(job_id=job_id).exists()
    assert STATE.current_job is None and job_files(STATE.spool_dir, job_id) == []


def test_a_node_run_of_a_job_with_one_node_is_refused(agent) -> None:  # noqa: ANN001
    job_id, job, spec = delivery(agent, ["plan"])
    node = {**spec, "node": {"nnodes": 2, "node_rank": 1, "master_addr": "127.0.0.1", "master_port": 29500}}
    assert NodeRun(run_job_task, PortalClient(STATE.portal_url, STATE.token), job_id, job, node, 1).run() is None
    assert Job.objects.get(pk=job_id).state == "dispatched"  # node 0's claim is still the portal's to take
    assert STATE.current_job is None and job_files(STATE.spool_dir / "node1", job_id) == []
