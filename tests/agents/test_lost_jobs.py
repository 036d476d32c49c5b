"""Lost-job detection (``recovery.do_requeue_lost_jobs``, run by the periodic ``detect_lost_jobs_task``) on real rows;
the re-queued job is sent to the real broker (Redis)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.fleet.models import Agent
from apps.jobs.models import Job, JobEvent
from apps.jobs.tasks import detect_lost_jobs_task
from contract import queues
from tests.agents.conftest import unique_slug
from tests.factories import HardwareFactory, JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running_job():  # noqa: ANN201
    hardware = HardwareFactory(slug=unique_slug("lost"))
    agent = Agent.objects.create(hardware=hardware, hostname="h1", last_heartbeat_at=timezone.now())
    job = JobFactory(hardware=hardware, state="running", attempts=1, agent=agent,
                     dispatched_at=timezone.now() - timedelta(minutes=5))
    agent.current_job = job
    agent.save()
    yield job, agent
    from day0portal.celery import app

    with app.connection_for_write() as conn:  # leave no message behind in hw.<slug>
        conn.default_channel.queue_purge(queues.hardware_queue(hardware.slug))


def test_a_heartbeating_agent_keeps_its_job(running_job) -> None:  # noqa: ANN001
    job, _ = running_job
    assert detect_lost_jobs_task() == []
    assert Job.objects.get(pk=job.pk).state == "running"


def test_a_silent_agents_job_is_lost_then_requeued_and_dispatched(running_job, monkeypatch) -> None:  # noqa: ANN001
    job, agent = running_job
    monkeypatch.setenv("DAY0_AGENT_LOST_SECONDS", "30")
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=31))
    assert detect_lost_jobs_task() == [job.pk]
    job.refresh_from_db()
    assert job.state == "dispatched" and job.attempts == 2 and job.agent is None


def test_a_restarted_agent_reporting_no_job_loses_it(running_job) -> None:  # noqa: ANN001
    job, agent = running_job
    Agent.objects.filter(pk=agent.pk).update(current_job=None)  # alive, but the job is not what it runs
    assert detect_lost_jobs_task() == [job.pk]
    assert Job.objects.get(pk=job.pk).attempts == 2


def test_after_the_last_attempt_the_job_stays_lost(running_job, monkeypatch) -> None:  # noqa: ANN001
    job, agent = running_job
    monkeypatch.setenv("DAY0_JOB_MAX_ATTEMPTS", "1")
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert detect_lost_jobs_task() == [job.pk]
    job.refresh_from_db()
    assert job.state == "lost" and "gave up after 1 attempts" in job.error


def test_the_reason_a_job_was_lost_is_kept_as_an_event_of_its_log(running_job, monkeypatch) -> None:  # noqa: ANN001
    job, agent = running_job
    JobEvent.objects.create(job=job, seq=1, ts=timezone.now(), kind="log", message="agent runs the job")
    Job.objects.filter(pk=job.pk).update(events_acked=1, events_max_seq=1)
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert detect_lost_jobs_task() == [job.pk]
    lost = JobEvent.objects.get(job=job, kind="lost")
    assert lost.seq == 2 and lost.level == "warning"
    assert lost.message == "attempt 1 lost: agent h1 stopped heartbeating; re-queued for attempt 2 of 3"
    assert lost.data == {"attempt": 1, "reason": "agent h1 stopped heartbeating", "requeued": True}
    assert Job.objects.get(pk=job.pk).events_acked == 2  # the next agent's spool continues after it


def test_a_dispatched_job_nobody_claims_gets_one_stuck_event_per_attempt(monkeypatch) -> None:
    monkeypatch.setenv("DAY0_JOB_STUCK_SECONDS", "30")
    hardware = HardwareFactory(slug=unique_slug("stuck"))
    job = JobFactory(hardware=hardware, state="dispatched", attempts=1,
                     dispatched_at=timezone.now() - timedelta(seconds=45))
    detect_lost_jobs_task()
    detect_lost_jobs_task()
    stuck = list(JobEvent.objects.filter(job=job, kind="stuck"))
    assert len(stuck) == 1 and stuck[0].data["attempt"] == 1
    assert f"no agent of {hardware.slug} is online; none has ever registered" in stuck[0].message
    assert Job.objects.get(pk=job.pk).state == "dispatched"  # a notice, not a state change
