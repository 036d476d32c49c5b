"""Agents post ordered event batches; the portal stores them idempotently on (job, seq), answers the highest
contiguous seq, and broadcasts only what was new, after commit, on the real Redis channel layer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from apps.jobs.events import job_group
from apps.jobs.models import JobEvent
from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db


def _events(seqs, stage: str = "load") -> list[dict]:
    ts = datetime(2026, 1, 1, tzinfo=UTC).isoformat()
    return [{"seq": s, "ts": ts, "stage": stage, "kind": "progress", "level": "info", "message": f"step {s}",
             "data": {"done": s}} for s in seqs]


@pytest.fixture
def agent_job() -> tuple:
    hardware = HardwareFactory()
    job = JobFactory(hardware=hardware)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    return job, token


def test_batches_are_idempotent_and_ack_the_contiguous_prefix(api_client, agent_job) -> None:
    job, token = agent_job
    url = f"/api/v1/jobs/{job.pk}/events/"
    assert api_client.post(url, _events([1, 2, 3]), format="json", **auth(token)).json() == {"acked": 3}
    assert api_client.post(url, _events([5, 6]), format="json", **auth(token)).json() == {"acked": 3}  # gap at 4
    assert api_client.post(url, _events([1, 2, 3, 4]), format="json", **auth(token)).json() == {"acked": 6}
    assert list(JobEvent.objects.filter(job=job).values_list("seq", flat=True)) == [1, 2, 3, 4, 5, 6]
    # the {"events": [...]} form is the same
    assert api_client.post(url, {"events": _events([7])}, format="json", **auth(token)).json() == {"acked": 7}


def test_readers_page_through_events_in_order(api_client, agent_job) -> None:
    job, token = agent_job
    url = f"/api/v1/jobs/{job.pk}/events/"
    api_client.post(url, _events(range(10, 0, -1)), format="json", **auth(token))
    page = api_client.get(f"{url}?after=3&limit=4").json()
    assert [e["seq"] for e in page["events"]] == [4, 5, 6, 7]
    assert page["has_more"] is True and page["next_after"] == 7 and page["acked"] == 10
    rest = api_client.get(f"{url}?after=7").json()
    assert [e["seq"] for e in rest["events"]] == [8, 9, 10] and rest["has_more"] is False
    assert rest["events"][0]["data"] == {"done": 8}
    assert api_client.get(f"{url}?after=x").status_code == 400


@pytest.mark.parametrize(("mutate", "key"), [
    (lambda e: e.update(seq=0), "events[0].seq"),
    (lambda e: e.update(seq="1"), "events[0].seq"),
    (lambda e: e.update(ts="yesterday"), "events[0].ts"),
    (lambda e: e.update(level="loud"), "events[0].level"),
    (lambda e: e.update(kind=""), "events[0].kind"),
    (lambda e: e.update(data=[1]), "events[0].data"),
])
def test_a_bad_event_rejects_the_batch_naming_it(api_client, agent_job, mutate, key) -> None:
    job, token = agent_job
    batch = _events([1, 2])
    mutate(batch[0])
    response = api_client.post(f"/api/v1/jobs/{job.pk}/events/", batch, format="json", **auth(token))
    assert response.status_code == 400 and key in response.json(), response.content
    assert not JobEvent.objects.filter(job=job).exists()


def test_only_an_agent_of_the_jobs_hardware_posts_events(api_client, agent_job) -> None:
    job, _ = agent_job
    url = f"/api/v1/jobs/{job.pk}/events/"
    other = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=HardwareFactory())
    submitter = make_token(organization=job.organization)
    assert api_client.post(url, _events([1]), format="json", **auth(other)).status_code == 403
    assert api_client.post(url, _events([1]), format="json", **auth(submitter)).status_code == 403
    assert api_client.post(url, _events([1]), format="json").status_code == 401
    assert not JobEvent.objects.exists()


def test_new_events_are_broadcast_once_to_the_job_group(api_client, agent_job,
                                                        django_capture_on_commit_callbacks) -> None:
    job, token = agent_job
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(job_group(job.pk), channel)
    url = f"/api/v1/jobs/{job.pk}/events/"
    with django_capture_on_commit_callbacks(execute=True):
        api_client.post(url, _events([1, 2]), format="json", **auth(token))
    with django_capture_on_commit_callbacks(execute=True):
        api_client.post(url, _events([2, 3]), format="json", **auth(token))  # 2 is a duplicate

    async def drain() -> list[dict]:
        out = []
        while True:
            try:
                out.append(await asyncio.wait_for(layer.receive(channel), timeout=1.0))
            except TimeoutError:
                return out

    messages = async_to_sync(drain)()
    assert [m["type"] for m in messages] == ["job.events", "job.events"]
    assert [[e["seq"] for e in m["events"]] for m in messages] == [[1, 2], [3]]
    assert messages[0]["events"][0]["message"] == "step 1" and messages[0]["job"] == job.pk
