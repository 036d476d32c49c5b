"""The agent's event spool against a real portal that goes away: nothing lost, nothing duplicated, in order."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agents.worker.client import PortalClient
from agents.worker.spool import JobSpool, SpoolSender
from apps.accounts.choices import Scope
from apps.jobs.models import Job, JobEvent
from tests.agents.conftest import PortalProcess
from tests.factories import JobFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)


def stored(job: Job) -> list[int]:
    return list(JobEvent.objects.filter(job=job).order_by("seq").values_list("seq", flat=True))


def append(spool: JobSpool, first: int, last: int) -> None:
    for n in range(first, last + 1):
        assert spool.append(stage="load", kind="progress", message=f"{n}", data={"done": n, "total": 1000}) == n


def test_spool_file_survives_a_restart_and_continues_the_seq(tmp_path: Path) -> None:
    spool = JobSpool(tmp_path, 7)
    append(spool, 1, 5)
    spool.mark_acked(2)
    with spool.events_path.open("a") as fh:
        fh.write('{"seq": 6, "ts": "2026-')  # a kill mid-write leaves a torn last line
    reopened = JobSpool(tmp_path, 7)
    assert [e["seq"] for e in reopened.pending(100)] == [3, 4, 5]
    assert reopened.append(stage="", kind="log", message="after restart") == 6
    assert JobSpool(tmp_path, 7, portal_acked=10).append(stage="", kind="log", message="x") == 11  # portal knows more


@pytest.mark.parametrize("outage_seconds", [2, pytest.param(10, marks=pytest.mark.slow)])
def test_events_spooled_while_the_portal_is_away_arrive_once_in_order(tmp_path: Path, outage_seconds: int) -> None:
    job = JobFactory()
    token = make_token(organization=job.organization, scopes=[Scope.AGENT], hardware=job.hardware)
    portal = PortalProcess()  # not started yet: unreachable
    client = PortalClient(portal.url, token.secret, timeout=5)
    spool = JobSpool(tmp_path, job.pk)
    sender = SpoolSender(spool, client.post_events, interval=0.1, batch_size=100, max_backoff=1.0).start()
    try:
        append(spool, 1, 250)
        time.sleep(1)
        assert sender.failures > 0 and spool.pending_count() == 250
        # the agent restarts before the portal returns: a new spool object reads the file
        sender.stop()
        spool.close(remove_if_acked=False)
        spool = JobSpool(tmp_path, job.pk)
        sender = SpoolSender(spool, client.post_events, interval=0.1, batch_size=100, max_backoff=1.0).start()
        portal.start()
        assert sender.flush(60), sender.last_error
        assert stored(job) == list(range(1, 251))
        append(spool, 251, 300)
        portal.stop()  # an outage in the middle of the job
        append(spool, 301, 400)
        time.sleep(outage_seconds)
        assert spool.pending_count() >= 100
        portal.start()
        assert sender.flush(60), sender.last_error
    finally:
        sender.stop()
        portal.stop()
        client.close()
    assert stored(job) == list(range(1, 401))
    assert Job.objects.get(pk=job.pk).events_acked == 400
    assert json.loads(spool.acked_path.read_text()) == 400
    spool.close()
    assert not spool.events_path.exists()  # everything acknowledged: the spool is cleaned up
