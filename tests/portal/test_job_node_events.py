"""A multi-node job's other nodes reach the job's event log: node R's events, posted in its own seqs on its row,
join the log as node R's sequence (numbered by the portal in order, contiguous across attempts) beside node 0's,
whose numbering and public API stay as they were; each is broadcast on the real Redis channel layer after
commit as a ``job.node_events`` message naming the node."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from apps.fleet.models import Agent
from apps.jobs import dispatch, eventlog, services
from apps.jobs.choices import JobState
from apps.jobs.events import job_group
from apps.jobs.models import JobEvent, JobNode, NodeState
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, make_token

pytestmark = pytest.mark.django_db


def _events(seqs, stage: str = "load", who: str = "node 0") -> list[dict]:
    return [{"seq": s, "ts": timezone.now().isoformat(), "stage": stage, "kind": "stage_finished",
             "level": "info", "message": f"{who} step {s}", "data": {"stage": stage, "passed": True}}
            for s in seqs]


@pytest.fixture
def two_node_job(api_client, monkeypatch):  # noqa: ANN201
    """A running two-node job: node 0 claimed the job, node 1 its node; (job, url, headers, agents)."""
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): None)  # the broker: test_job_nodes
    hardware = HardwareFactory()
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    agents = [Agent.objects.create(hardware=hardware, hostname=f"host-{i}", token=token,
                                   last_heartbeat_at=timezone.now(),
                                   capabilities={"address": f"10.0.0.{i + 1}", "rendezvous_port": 31000})
              for i in range(2)]
    headers = {"HTTP_AUTHORIZATION": f"Token {token.secret}"}
    job = JobFactory(hardware=hardware, model=ModelReleaseFactory(visibility="public"), state=JobState.QUEUED,
                     nodes=2)
    services.do_dispatch_job(job.pk)
    url = f"/api/v1/jobs/{job.pk}"
    node0 = JobNode.objects.get(job=job, rank=0).agent_id
    assert api_client.post(f"{url}/state/", {"state": "running", "agent": node0, "attempt": 1}, format="json",
                           **headers).status_code == 200
    assert api_client.post(f"{url}/nodes/1/", {"state": "running", "attempt": 1}, format="json",
                           **headers).status_code == 200
    return job, url, headers, agents


def test_node_1s_events_join_the_log_as_its_own_sequence_beside_node_0s(api_client, two_node_job) -> None:
    job, url, headers, _ = two_node_job
    base = JobEvent.objects.filter(job=job, node=0).count()  # the portal's own events of the dispatch, if any
    assert api_client.post(f"{url}/events/", _events([base + 1, base + 2]), format="json",
                           **headers).json() == {"acked": base + 2}
    # node 1 posts 2 before 1: only the contiguous prefix joins the log, in node 1's order
    assert api_client.post(f"{url}/nodes/1/events/", _events([2], who="node 1"), format="json",
                           **headers).json() == {"acked": 0}
    assert not JobEvent.objects.filter(job=job, node=1).exists()
    assert api_client.post(f"{url}/nodes/1/events/", _events([1, 2, 3], who="node 1"), format="json",
                           **headers).json() == {"acked": 3}
    rows = list(JobEvent.objects.filter(job=job, node=1).order_by("seq").values_list("seq", "message"))
    assert rows == [(1, "node 1 step 1"), (2, "node 1 step 2"), (3, "node 1 step 3")]
    # node 0 goes on in its own numbering; its seqs may equal node 1's without either being dropped
    assert api_client.post(f"{url}/events/", _events([base + 3]), format="json",
                           **headers).json() == {"acked": base + 3}
    public = api_client.get(f"{url}/events/?after={base}", **headers).json()
    assert public["node"] == 0 and public["acked"] == base + 3
    assert [e["message"] for e in public["events"]] == [f"node 0 step {s}" for s in range(base + 1, base + 4)]
    node1 = api_client.get(f"{url}/events/?node=1&after=1", **headers).json()
    assert node1["node"] == 1 and node1["acked"] == 3 and [e["seq"] for e in node1["events"]] == [2, 3]
    assert node1["events"][0]["message"] == "node 1 step 2" and node1["next_after"] == 3
    bad = api_client.get(f"{url}/events/?node=2", **headers)
    assert bad.status_code == 400 and "node" in bad.json(), bad.content  # the job runs on nodes 0 and 1


def test_a_later_attempts_node_continues_its_sequence(api_client, two_node_job) -> None:
    from apps.jobs import node_services

    job, url, headers, agents = two_node_job
    api_client.post(f"{url}/nodes/1/events/", _events([1, 2], who="attempt 1"), format="json", **headers)
    # a second attempt: the first one's nodes released, node 1 on the same agent, its own seqs from 1 again
    JobNode.objects.filter(job=job).update(state=NodeState.RELEASED)
    job.refresh_from_db()
    job.attempts += 1
    job.save(update_fields=["attempts"])
    first = JobNode.objects.get(job=job, rank=1)
    JobNode.objects.create(job=job, attempt=job.attempts, rank=1, agent=first.agent, master_addr="10.0.0.1",
                           master_port=31000, state=NodeState.RUNNING, claimed_at=timezone.now())
    actor = _agent_actor(headers)
    parsed = eventlog.parse_event_batch(_events([1, 2], who="attempt 2"), max_events=10)
    assert node_services.check_store_node_events(actor, job, 1, parsed) == 2  # the new row's own ack
    rows = list(JobEvent.objects.filter(job=job, node=1).order_by("seq").values_list("seq", "message"))
    assert rows == [(1, "attempt 1 step 1"), (2, "attempt 1 step 2"), (3, "attempt 2 step 1"),
                    (4, "attempt 2 step 2")]


def _agent_actor(headers: dict):  # noqa: ANN202
    from apps.accounts.access import actor_of
    from apps.accounts.authentication import find_token

    token, _ = find_token(headers["HTTP_AUTHORIZATION"].split()[1])
    return actor_of(token.user, token)


def test_node_events_are_broadcast_once_naming_the_node(api_client, two_node_job,
                                                        django_capture_on_commit_callbacks) -> None:
    job, url, headers, _ = two_node_job
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(job_group(job.pk), channel)
    with django_capture_on_commit_callbacks(execute=True):
        api_client.post(f"{url}/nodes/1/events/", _events([1, 2], who="node 1"), format="json", **headers)
    with django_capture_on_commit_callbacks(execute=True):
        api_client.post(f"{url}/nodes/1/events/", _events([2, 3], who="node 1"), format="json", **headers)

    async def drain() -> list[dict]:
        out = []
        while True:
            try:
                out.append(await asyncio.wait_for(layer.receive(channel), timeout=1.0))
            except TimeoutError:
                return out

    messages = [m for m in async_to_sync(drain)() if m["type"] != "job.state"]
    assert [(m["type"], m["node"]) for m in messages] == [("job.node_events", 1), ("job.node_events", 1)]
    assert [[e["seq"] for e in m["node_events"]] for m in messages] == [[1, 2], [3]]
    assert "events" not in messages[0]  # a client that knows only job.events leaves it alone
    assert messages[0]["node_events"][0]["message"] == "node 1 step 1" and messages[0]["job"] == job.pk


def test_a_node_event_naming_no_stage_of_the_job_is_403_to_a_stranger_and_400_to_the_node(api_client,
                                                                                         two_node_job) -> None:
    """The token is checked before the batch's stages: a stranger learns nothing of the job's stages."""
    job, url, headers, _ = two_node_job
    stranger = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=HardwareFactory())
    forged = _events([1], stage="../x")
    response = api_client.post(f"{url}/nodes/1/events/", forged, format="json",
                               HTTP_AUTHORIZATION=f"Token {stranger.secret}")
    assert response.status_code == 403, response.content
    response = api_client.post(f"{url}/nodes/1/events/", forged, format="json", **headers)
    assert response.status_code == 400 and "'../x' is not a stage of job" in str(response.json()["events[0].stage"])
    assert JobNode.objects.get(job=job, rank=1, attempt=1).events == []
