"""The agent's task (``agents.worker.tasks``): which deliveries it runs, skips or hands back, run eagerly in this
process against a real portal, and the currency rule it applies."""

from __future__ import annotations

import pytest
from celery.exceptions import Reject

from agents.worker.agent_state import STATE
from agents.worker.tasks import _is_current, run_job_task
from apps.jobs.models import Job, JobEvent
from tests.agents.test_job_flow import cell  # noqa: F401 - a tiny MoE release, its hardware and tokens
from tests.agents.test_runs import agent, delivery  # noqa: F401 - this process as the cell's agent


@pytest.mark.parametrize(("state", "attempts", "running_ok", "why"), [
    ("queued", 1, False, None),
    ("dispatched", 1, False, None),
    ("running", 1, False, "job is running"),  # claimed already: a redelivery of node 0's task
    ("running", 1, True, None),  # another node joins the job node 0 claimed
    ("succeeded", 1, True, "job is succeeded"),
    ("dispatched", 2, False, "delivery of attempt 1 but the job is at attempt 2"),
    ("dispatched", None, False, None),  # a portal that does not say: the claim decides
])
def test_a_delivery_is_current_while_its_job_waits_at_its_attempt(state: str, attempts: int | None,
                                                                   running_ok: bool, why: str | None) -> None:
    assert _is_current({"state": state, "attempts": attempts}, {"attempt": 1}, running_ok=running_ok) == why


@pytest.mark.django_db(transaction=True)
def test_a_stale_delivery_is_skipped_without_a_claim(agent) -> None:  # noqa: ANN001, F811
    job_id, _, spec = delivery(agent, ["plan"])
    result = run_job_task.apply(args=[job_id, {**spec, "attempt": spec["attempt"] - 1}])
    assert result.successful() and result.result is None
    assert Job.objects.get(pk=job_id).state == "dispatched" and not JobEvent.objects.filter(job_id=job_id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_stopping_agent_hands_the_delivery_back(agent, monkeypatch) -> None:  # noqa: ANN001, F811
    job_id, _, spec = delivery(agent, ["plan"])
    monkeypatch.setattr(STATE, "stopping", type(STATE.stopping)())
    STATE.stopping.set()
    result = run_job_task.apply(args=[job_id, spec])
    assert isinstance(result.result, Reject) and result.result.requeue is True
    assert Job.objects.get(pk=job_id).state == "dispatched"


@pytest.mark.django_db(transaction=True)
def test_a_node_delivery_goes_to_the_node_and_a_job_delivery_to_the_job(agent) -> None:  # noqa: ANN001, F811
    job_id, _, spec = delivery(agent, ["plan"])
    node = {**spec, "node": {"nnodes": 2, "node_rank": 1, "master_addr": "127.0.0.1", "master_port": 29500}}
    assert run_job_task.apply(args=[job_id, node]).result is None  # the portal reserved no node 1: refused
    assert Job.objects.get(pk=job_id).state == "dispatched"
    summary = run_job_task.apply(args=[job_id, spec]).result
    assert summary == {"job": job_id, "tier": 1, "failed_stage": None}
    assert Job.objects.get(pk=job_id).state == "succeeded"
