"""Domain events (``apps.core.events``): ``publish`` reaches receivers only after the writer's transaction commits,
never for a rolled-back one, and a failing receiver neither fails the writer nor stops the other receivers;
``send_now`` runs inside the transaction. And the wiring: a failed job reaches the alerts app's receiver."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.dispatch import Signal

from apps.core import events
from apps.jobs.choices import JobState
from apps.jobs.services import do_transition_job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_publish_waits_for_commit_and_a_failing_receiver_stops_nothing(django_capture_on_commit_callbacks) -> None:
    event, heard = Signal(), []

    def broken(**facts: Any) -> None:
        raise RuntimeError("receiver down")

    def listening(**facts: Any) -> None:
        heard.append(facts["value"])

    event.connect(broken, weak=False)
    event.connect(listening, weak=False)
    with django_capture_on_commit_callbacks(execute=True):
        events.publish(event, value=1)
        assert heard == []  # not before the commit
    assert heard == [1]

    with pytest.raises(ValueError), django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            events.publish(event, value=2)
            raise ValueError("the write fails")
    assert heard == [1]  # the rolled-back fact was never published


def test_send_now_runs_inside_the_transaction_and_raises() -> None:
    event = Signal()

    def refuse(**facts: Any) -> None:
        raise RuntimeError(f"refused {facts['value']}")

    event.connect(refuse, weak=False)
    with pytest.raises(RuntimeError, match="refused 3"):
        events.send_now(event, value=3)


def test_a_failed_job_is_published_with_its_facts_at_the_time(django_capture_on_commit_callbacks) -> None:
    heard: list[dict[str, Any]] = []

    def listening(**facts: Any) -> None:
        heard.append(facts)

    events.job_failed.connect(listening, weak=False)
    try:
        job = JobFactory()
        with django_capture_on_commit_callbacks(execute=True):
            do_transition_job(job, JobState.FAILED, failed_stage="load", error="shard 2 digest differs")
    finally:
        events.job_failed.disconnect(listening)
    assert len(heard) == 1
    facts = heard[0]
    assert (facts["job_id"], facts["state"], facts["failed_stage"]) == (job.pk, "failed", "load")
    assert (facts["model_id"], facts["hardware_id"]) == (job.model_id, job.hardware_id)
    assert "alerts.job_failed" in {key[0] for key, *_ in events.job_failed.receivers}  # AlertsConfig.ready's
