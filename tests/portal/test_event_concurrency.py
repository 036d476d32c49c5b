"""Concurrent batches of one job (an agent retrying while its first request is still in flight) serialize on
the job row: every event is stored once and the ack is the contiguous prefix."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from django.db import connection

from apps.jobs.eventlog import do_store_job_events
from apps.jobs.models import Job, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _batch(seqs: range) -> list[dict]:
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    return [{"seq": s, "ts": ts, "stage": "", "kind": "log", "level": "info", "message": str(s), "data": None}
            for s in seqs]


def test_overlapping_batches_from_threads_store_each_event_once() -> None:
    job = JobFactory()
    batches = [range(1, 401), range(201, 601), range(1, 601), range(401, 801)]
    errors: list[BaseException] = []

    def post(seqs: range) -> None:
        try:
            do_store_job_events(Job.objects.get(pk=job.pk), _batch(seqs))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    seqs = list(JobEvent.objects.filter(job=job).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 801))
    assert Job.objects.get(pk=job.pk).events_acked == 800
