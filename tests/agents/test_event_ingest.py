"""Event batches from agents: idempotent on (job, seq), stored in order whatever the arrival order, and only from
an agent token bound to the job's hardware."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from apps.accounts.choices import Scope
from apps.evidence.models import StageResult
from apps.jobs.models import JobEvent
from tests.factories import HardwareFactory, JobFactory, auth, make_token

pytestmark = pytest.mark.django_db


def batch(*seqs: int, stage: str = "load") -> dict:
    return {"events": [{"seq": s, "ts": datetime.now(UTC).isoformat(), "stage": stage, "kind": "log",
                        "level": "info", "message": f"event {s}", "data": {"n": s}} for s in seqs]}


@pytest.fixture
def job_and_token():  # noqa: ANN201
    job = JobFactory()
    token = make_token(organization=job.organization, scopes=[Scope.AGENT], hardware=job.hardware)
    return job, token


def post(client, job, token, body):  # noqa: ANN001, ANN201
    return client.post(f"/api/v1/jobs/{job.pk}/events/", body, format="json", **auth(token))


def test_duplicate_and_out_of_order_batches_are_stored_once_in_order(api_client, job_and_token) -> None:  # noqa: ANN001
    job, token = job_and_token
    assert post(api_client, job, token, batch(4, 5, 6)).json() == {"acked": 0}  # a gap: nothing contiguous yet
    assert post(api_client, job, token, batch(1, 2)).json() == {"acked": 2}
    assert post(api_client, job, token, batch(4, 5, 6)).json() == {"acked": 2}  # a resend changes nothing
    assert post(api_client, job, token, batch(2, 3)).json() == {"acked": 6}  # overlap, then the gap closes
    assert post(api_client, job, token, batch(1, 2, 3, 4, 5, 6)).json() == {"acked": 6}
    rows = list(JobEvent.objects.filter(job=job).order_by("seq").values_list("seq", "message"))
    assert rows == [(s, f"event {s}") for s in range(1, 7)]
    page = api_client.get(f"/api/v1/jobs/{job.pk}/events/?after=3", **auth(token)).json()
    assert [e["seq"] for e in page["events"]] == [4, 5, 6]


def test_a_bad_event_names_the_item_and_stores_nothing(api_client, job_and_token) -> None:  # noqa: ANN001
    job, token = job_and_token
    body = batch(1, 2)
    body["events"][1]["seq"] = "two"
    response = post(api_client, job, token, body)
    assert response.status_code == 400 and "events[1].seq" in response.content.decode()
    assert not JobEvent.objects.filter(job=job).exists()


def test_an_agent_token_cannot_report_on_another_hardwares_job(api_client, job_and_token) -> None:  # noqa: ANN001
    job, _ = job_and_token
    other = make_token(organization=job.organization, scopes=[Scope.AGENT], hardware=HardwareFactory())
    assert post(api_client, job, other, batch(1)).status_code == 403
    result = api_client.post(f"/api/v1/jobs/{job.pk}/results/", {"stage": "env", "section": {"torch": "x"}},
                             format="json", **auth(other))
    assert result.status_code == 403
    state = api_client.post(f"/api/v1/jobs/{job.pk}/state/", {"state": "failed"}, format="json", **auth(other))
    assert state.status_code == 403
    assert not JobEvent.objects.filter(job=job).exists() and not StageResult.objects.filter(job=job).exists()
    submitter = make_token(organization=job.organization)  # a vendor's submit token is no agent either
    assert post(api_client, job, submitter, batch(1)).status_code == 403
