"""A job whose plan spans several hosts runs on as many agents of its hardware at once, or on none: the portal
reserves N idle agents atomically (PostgreSQL row locks, SKIP LOCKED), tells each its node rank and the
rendezvous address (node 0's reported address and a port), sends each node's task to its agent's own queue (the
real Redis broker), and otherwise keeps the job queued saying how many agents are free against how many are
needed."""

from __future__ import annotations

import base64
import json
import threading
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.fleet.models import Agent
from apps.jobs import dispatch, placement, recovery, services
from apps.jobs.choices import JobState
from apps.jobs.models import Job, JobEvent, JobNode, NodeState
from contract import queues
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token


def _agents(hardware, n: int, *, busy: int = 0, offline: int = 0) -> list[Agent]:
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    now = timezone.now()
    agents = [Agent.objects.create(hardware=hardware, hostname=f"host-{i}", token=token, last_heartbeat_at=now,
                                   capabilities={"address": f"10.0.0.{i + 1}", "rendezvous_port": 31000})
              for i in range(n + busy + offline)]
    for agent in agents[n:n + busy]:
        agent.current_job = JobFactory(hardware=hardware, state=JobState.RUNNING)
        agent.save(update_fields=["current_job"])
    Agent.objects.filter(pk__in=[a.pk for a in agents[n + busy:]]).update(
        last_heartbeat_at=now - timedelta(minutes=10))
    agents[0].token_secret = token.secret
    return agents


def _broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def _queued(queue: str) -> list[dict]:
    """The task messages waiting on ``queue`` in the real broker (kombu's Redis transport keeps a list)."""
    return [json.loads(raw) for raw in _broker().lrange(queue, 0, -1)]


@pytest.fixture
def clean_queues():
    names: list[str] = []
    yield names
    if names:
        _broker().delete(*names)


@pytest.mark.django_db
def test_a_two_node_job_reserves_two_idle_agents_and_sends_each_its_node(clean_queues) -> None:
    hardware = HardwareFactory()
    agents = _agents(hardware, 3, busy=1, offline=1)
    clean_queues += [queues.agent_queue(a.pk) for a in agents]
    _broker().delete(*clean_queues)
    job = JobFactory(hardware=hardware, model=ModelReleaseFactory(visibility="public"), state=JobState.QUEUED,
                     nodes=2)
    services.do_dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.state == JobState.DISPATCHED and job.attempts == 1
    nodes = list(JobNode.objects.filter(job=job).order_by("rank"))
    assert [(n.rank, n.agent_id, n.state) for n in nodes] == [(0, agents[0].pk, "reserved"),
                                                              (1, agents[1].pk, "reserved")]
    port = 31000 + placement.PORTS_PER_JOB * (job.pk % placement.PORT_SLOTS)
    assert {(n.master_addr, n.master_port, n.attempt) for n in nodes} == {("10.0.0.1", port, 1)}
    for rank, agent in enumerate(agents[:2]):
        [message] = _queued(queues.agent_queue(agent.pk))
        body = json.loads(base64.b64decode(message["body"]))
        job_id, spec = body[0]
        assert job_id == job.pk and spec["attempt"] == 1
        assert spec["node"] == {"nnodes": 2, "node_rank": rank, "master_addr": "10.0.0.1", "master_port": port,
                                "agent": agent.pk}
    assert all(_queued(queues.agent_queue(a.pk)) == [] for a in agents[2:])  # the third, busy, offline
    # the reserved agents are not idle for another job until this one ends
    assert set(placement.idle_agents(hardware).values_list("pk", flat=True)) == {agents[2].pk}
    services.do_transition_job(job, JobState.CANCELLED)
    assert set(JobNode.objects.filter(job=job).values_list("state", flat=True)) == {NodeState.RELEASED}
    assert set(placement.idle_agents(hardware).values_list("pk", flat=True)) == {a.pk for a in agents[:3]}


@pytest.mark.django_db
def test_with_fewer_idle_agents_than_nodes_none_is_reserved_and_the_job_says_why(api_client, monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): None)  # the broker: the first test
    hardware = HardwareFactory()
    agents = _agents(hardware, 1, busy=1)
    org = OrganizationFactory()
    job = JobFactory(hardware=hardware, model=ModelReleaseFactory(organization=org, visibility="public"),
                     state=JobState.QUEUED, nodes=2)
    for _ in range(2):  # the periodic retry writes the reason once
        services.do_dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.attempts == 0
    assert not JobNode.objects.filter(job=job).exists()
    reason = f"waiting for 2 agents of {hardware.slug} at once (the plan spans 2 nodes): 1 free of 2 online"
    assert job.error.startswith(reason)
    assert list(JobEvent.objects.filter(job=job, kind="waiting").values_list("message", flat=True)) == [job.error]
    detail = api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(make_token(organization=org))).json()
    assert detail["waiting_reason"].startswith(reason) and detail["nodes"] == 2 and detail["node_rows"] == []
    agents[1].current_job = None  # the busy agent is done: the next retry reserves both
    agents[1].save(update_fields=["current_job"])
    services.do_dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.state == JobState.DISPATCHED and JobNode.objects.filter(job=job).count() == 2


@pytest.mark.django_db(transaction=True)
def test_two_jobs_dispatched_at_once_never_share_an_agent(monkeypatch) -> None:
    hardware = HardwareFactory()
    _agents(hardware, 3)
    jobs = [JobFactory(hardware=hardware, state=JobState.QUEUED, nodes=2) for _ in range(2)]
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): None)  # the broker is not what is tested here
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def dispatch_one(job_id: int) -> None:
        try:
            barrier.wait(timeout=10)
            services.do_dispatch_job(job_id)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatch_one, args=(job.pk,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    states = sorted(Job.objects.get(pk=j.pk).state for j in jobs)
    assert states == [JobState.DISPATCHED, JobState.QUEUED]  # 3 agents hold one 2-node job, not two
    reserved = list(JobNode.objects.filter(state=NodeState.RESERVED).values_list("agent_id", flat=True))
    assert len(reserved) == 2 and len(set(reserved)) == 2
    waiting = Job.objects.get(state=JobState.QUEUED, pk__in=[j.pk for j in jobs])
    assert "1 free of 3 online" in waiting.error


@pytest.mark.django_db
def test_a_broker_that_refuses_one_node_leaves_every_node_unreserved(monkeypatch) -> None:
    hardware = HardwareFactory()
    _agents(hardware, 2)
    job = JobFactory(hardware=hardware, state=JobState.QUEUED, nodes=2)
    sent: list[int] = []

    def refuse_the_second(job: Job, nodes=()) -> None:
        for node in nodes:
            if node.rank == 1:
                raise ConnectionError("broker went away")
            sent.append(node.rank)

    monkeypatch.setattr(dispatch, "send_job", refuse_the_second)
    services.do_dispatch_job(job.pk)
    job.refresh_from_db()
    assert sent == [0] and job.state == JobState.QUEUED and job.attempts == 0
    assert set(JobNode.objects.filter(job=job).values_list("state", flat=True)) == {NodeState.RELEASED}
    assert placement.idle_agents(hardware).count() == 2


@pytest.mark.django_db
def test_node_0_claims_the_job_and_node_1_claims_and_reports_its_node(api_client, monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): None)  # the broker: the first test
    hardware = HardwareFactory()
    agents = _agents(hardware, 2)
    headers = {"HTTP_AUTHORIZATION": f"Token {agents[0].token_secret}"}
    job = JobFactory(hardware=hardware, model=ModelReleaseFactory(visibility="public"), state=JobState.QUEUED,
                     nodes=2)
    services.do_dispatch_job(job.pk)
    url = f"/api/v1/jobs/{job.pk}"
    wrong = api_client.post(f"{url}/state/", {"state": "running", "agent": agents[1].pk, "attempt": 1},
                            format="json", **headers)
    assert wrong.status_code == 409 and "is not its node 0" in wrong.json()["detail"], wrong.content
    claim = api_client.post(f"{url}/state/", {"state": "running", "agent": agents[0].pk, "attempt": 1},
                            format="json", **headers)
    assert claim.status_code == 200, claim.content
    assert api_client.post(f"{url}/nodes/1/events/", [], format="json", **headers).status_code == 409  # not claimed
    node = api_client.post(f"{url}/nodes/1/", {"state": "running", "attempt": 1}, format="json", **headers)
    assert node.status_code == 200 and node.json()["state"] == "running", node.content
    events = [{"seq": s, "ts": timezone.now().isoformat(), "stage": "load", "kind": "stage_finished",
               "message": f"load ranks of node 1 ended ({s})"} for s in (2, 1)]
    assert api_client.post(f"{url}/nodes/1/events/", events, format="json", **headers).json() == {"acked": 2}
    assert api_client.post(f"{url}/nodes/1/events/", events[:1], format="json", **headers).json() == {"acked": 2}
    detail = api_client.get(f"{url}/", **headers).json()
    assert [(r["rank"], r["state"], r["events_acked"]) for r in detail["node_rows"]] == [(0, "running", 0),
                                                                                          (1, "running", 2)]
    # node 0 finishes the job first (every node is released); node 1's last event and state still land
    finish = api_client.post(f"{url}/state/", {"state": "succeeded", "agent": agents[0].pk}, format="json",
                             **headers)
    assert finish.status_code == 200, finish.content
    last = [{"seq": 3, "ts": timezone.now().isoformat(), "stage": "serve", "kind": "stage_finished",
             "message": "serve ranks of node 1 ended"}]
    assert api_client.post(f"{url}/nodes/1/events/", last, format="json", **headers).json() == {"acked": 3}
    done = api_client.post(f"{url}/nodes/1/", {"state": "finished"}, format="json", **headers)
    assert done.status_code == 200, done.content
    again = api_client.post(f"{url}/nodes/1/", {"state": "failed"}, format="json", **headers)
    assert again.status_code == 409  # a node ends once
    listed = api_client.get(f"{url}/nodes/1/events/", **headers).json()
    assert listed["state"] == "finished" and [e["seq"] for e in listed["events"]] == [1, 2, 3]
    assert api_client.get(f"{url}/nodes/5/events/", **headers).status_code == 404
    assert api_client.post(f"{url}/nodes/0/", {"state": "running"}, format="json", **headers).status_code == 400


@pytest.mark.django_db
def test_a_silent_node_agent_makes_the_multi_node_job_lost(monkeypatch) -> None:
    hardware = HardwareFactory()
    agents = _agents(hardware, 2)
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): None)
    job = JobFactory(hardware=hardware, state=JobState.QUEUED, nodes=2)
    services.do_dispatch_job(job.pk)
    services.do_transition_job(job, JobState.RUNNING, agent_id=agents[0].pk)
    Agent.objects.filter(pk=agents[1].pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=10))
    assert recovery.do_requeue_lost_jobs() == [job.pk]
    lost = JobEvent.objects.get(job=job, kind="lost")
    assert "agent host-1 (node 1) stopped heartbeating" in lost.message


@pytest.mark.django_db
def test_the_plan_decides_how_many_nodes_a_job_needs() -> None:
    hardware = HardwareFactory(devices_per_node=2)
    model = ModelReleaseFactory()
    assert placement.plan_nodes(model, hardware, {"dtype": "float32"}) == 1  # the tiny model fits one device
    assert placement.plan_nodes(model, hardware, {"dtype": "float32", "tp": 2, "pp": 2}) == 2  # 4 devices
    assert placement.plan_nodes(model, HardwareFactory(devices_per_node=2, shared_memory=True),
                                {"tp": 2, "pp": 2}) == 1  # CPU processes share one host


@pytest.mark.django_db
def test_an_agent_reserved_for_a_node_leaves_a_one_node_job_to_another_agent(api_client, monkeypatch) -> None:
    hardware = HardwareFactory()
    agents = _agents(hardware, 3)
    headers = {"HTTP_AUTHORIZATION": f"Token {agents[0].token_secret}"}
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): None)
    multi = JobFactory(hardware=hardware, state=JobState.QUEUED, nodes=2)
    services.do_dispatch_job(multi.pk)
    single = JobFactory(hardware=hardware, model=ModelReleaseFactory(visibility="public"), state=JobState.QUEUED)
    services.do_dispatch_job(single.pk)
    url = f"/api/v1/jobs/{single.pk}/state/"
    refused = api_client.post(url, {"state": "running", "agent": agents[1].pk}, format="json", **headers)
    assert refused.status_code == 409, refused.content
    assert f"is reserved for node 1 of job {multi.pk}" in refused.json()["detail"]
    taken = api_client.post(url, {"state": "running", "agent": agents[2].pk}, format="json", **headers)
    assert taken.status_code == 200, taken.content  # the free agent runs it


@pytest.mark.django_db
def test_a_node_that_fails_while_the_job_runs_fails_the_job_naming_it(api_client, monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): None)  # the broker: the first test
    hardware = HardwareFactory()
    agents = _agents(hardware, 2)
    headers = {"HTTP_AUTHORIZATION": f"Token {agents[0].token_secret}"}
    job = JobFactory(hardware=hardware, model=ModelReleaseFactory(visibility="public"), state=JobState.QUEUED,
                     nodes=2)
    services.do_dispatch_job(job.pk)
    url = f"/api/v1/jobs/{job.pk}"
    assert api_client.post(f"{url}/state/", {"state": "running", "agent": agents[0].pk}, format="json",
                           **headers).status_code == 200
    assert api_client.post(f"{url}/nodes/1/", {"state": "running"}, format="json", **headers).status_code == 200
    failed = api_client.post(f"{url}/nodes/1/", {"state": "failed", "error": "load: model directory missing"},
                             format="json", **headers)
    assert failed.status_code == 200, failed.content
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.failed_stage == "load"
    assert job.error == "node 1 (host-1) failed: load: model directory missing"
    assert set(JobNode.objects.filter(job=job).values_list("state", flat=True)) == {"released", "failed"}
