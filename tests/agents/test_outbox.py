"""The agent's results outbox against a real portal that is away: what a stage measured survives an agent
restart and is posted once, in order, when the portal is back."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.worker.client import PortalClient, PortalUnavailable
from agents.worker.outbox import ResultOutbox
from apps.accounts.choices import Scope
from apps.evidence.models import StageResult
from tests.agents.conftest import PortalProcess
from tests.factories import JobFactory, make_token
from tests.portal.reports import passing

pytestmark = pytest.mark.django_db(transaction=True)


def test_results_waiting_for_the_portal_survive_an_agent_restart(tmp_path: Path) -> None:
    job = JobFactory(spec={"stages": ["plan", "env"], "dtype": "bfloat16"})
    token = make_token(organization=job.organization, scopes=[Scope.AGENT], hardware=job.hardware)
    portal = PortalProcess()  # not started: the portal is away while the stages finish
    client = PortalClient(portal.url, token.secret, timeout=5)

    def post(stage: str, section: dict, binding: dict) -> None:
        client.post_result(job.pk, stage, section, binding)

    binding = {"attempt": job.attempts, "nonce": job.nonce}  # what the task payload carries
    outbox = ResultOutbox(tmp_path, job.pk, post, retry_on=PortalUnavailable, identity="job 1", binding=binding)
    outbox.add("plan", passing("plan"))
    outbox.add("env", passing("env"))
    with pytest.raises(PortalUnavailable):
        outbox.drain()
    outbox.close()  # the agent is killed: both sections stay on disk
    assert outbox.items_path.exists()
    try:
        restarted = ResultOutbox(tmp_path, job.pk, post, retry_on=PortalUnavailable, identity="job 1")
        assert len(restarted) == 2
        portal.start()
        restarted.drain()
        assert len(restarted) == 0 and restarted.refused == []
        restarted.close()
        assert not restarted.items_path.exists()
        again = ResultOutbox(tmp_path, job.pk, post, retry_on=PortalUnavailable, identity="job 1")
        assert len(again) == 0  # posted once: a later start has nothing left to send
    finally:
        portal.stop()
        client.close()
    assert sorted(StageResult.objects.filter(job=job).values_list("stage", flat=True)) == ["env", "plan"]


def test_a_torn_last_line_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    outbox = ResultOutbox(tmp_path, 3, lambda stage, section, binding: None, retry_on=PortalUnavailable)
    outbox.add("plan", {"fits": True})
    outbox.close(remove_if_sent=False)
    with outbox.items_path.open("a") as fh:
        fh.write('{"stage": "load", "sect')  # killed mid-write
    reopened = ResultOutbox(tmp_path, 3, lambda stage, section, binding: None, retry_on=PortalUnavailable)
    assert len(reopened) == 1
    reopened.add("env", {"torch": "2.13.0"})
    reopened.close(remove_if_sent=False)
    again = ResultOutbox(tmp_path, 3, lambda stage, section, binding: None, retry_on=PortalUnavailable)
    assert len(again) == 2  # the section added after the torn line is whole
