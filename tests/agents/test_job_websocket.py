"""``/ws/jobs/<id>/?after=SEQ`` and ``/ws/matrix/`` through the real ASGI application (Channels'
``WebsocketCommunicator``), the Redis channel layer and PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.db import connection

from apps.accounts.choices import Scope
from apps.jobs import eventlog
from apps.jobs.models import Job
from tests.factories import JobFactory, ModelReleaseFactory, OrganizationFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)
HEADERS = [(b"origin", b"http://localhost"), (b"host", b"localhost")]


def store(job: Job, *seqs: int) -> None:
    events = [{"seq": s, "ts": datetime.now(UTC), "stage": "load", "kind": "progress", "level": "info",
               "message": f"{s}", "data": {"done": s, "total": 100}} for s in seqs]
    eventlog.do_store_job_events(job, events)


def application():  # noqa: ANN201
    from day0portal.asgi import application as app

    return app


async def receive_events(comm: WebsocketCommunicator, until_seq: int, timeout: float = 10) -> list[int]:
    """Seqs of the ``job.events`` messages received until ``until_seq`` (state messages are skipped)."""
    seqs: list[int] = []
    while not seqs or seqs[-1] < until_seq:
        message = await comm.receive_json_from(timeout=timeout)
        if message["type"] == "job.events":
            seqs.extend(e["seq"] for e in message["events"])
    return seqs


@pytest.fixture
def job_and_token():  # noqa: ANN201
    job = JobFactory()
    return job, make_token(organization=job.organization, scopes=[Scope.READ])


def test_replay_after_seq_then_live_events_in_order_across_a_gap(job_and_token) -> None:  # noqa: ANN001
    job, token = job_and_token
    store(job, 1, 2, 3, 4, 5)

    async def scenario() -> None:
        comm = WebsocketCommunicator(application(), f"/ws/jobs/{job.pk}/?after=2&token={token.secret}",
                                     headers=HEADERS)
        connected, _ = await comm.connect()
        assert connected
        first = await comm.receive_json_from(timeout=10)
        assert first["type"] == "job.state" and first["state"] == "running"
        assert await receive_events(comm, 5) == [3, 4, 5]
        await _in_thread(store, job, 6, 7)
        assert await receive_events(comm, 7) == [6, 7]
        await _in_thread(store, job, 9, 10)  # arrives ahead of 8: held back
        assert await comm.receive_nothing(timeout=1)
        await _in_thread(store, job, 8)
        assert await receive_events(comm, 10) == [8, 9, 10]
        await comm.disconnect()

    async_to_sync(scenario)()


def test_client_joining_mid_job_gets_every_event_exactly_once_in_order(job_and_token) -> None:  # noqa: ANN001
    job, token = job_and_token
    total = 400
    store(job, *range(1, 51))
    writer_started = threading.Event()

    def writer() -> None:
        writer_started.set()
        for start in range(51, total + 1, 10):  # batches commit while the client connects and replays
            store(job, *range(start, min(start + 10, total + 1)))
            time.sleep(0.005)
        connection.close()

    async def scenario() -> None:
        thread = threading.Thread(target=writer)
        thread.start()
        writer_started.wait()
        comm = WebsocketCommunicator(application(), f"/ws/jobs/{job.pk}/?after=0&token={token.secret}",
                                     headers=HEADERS)
        connected, _ = await comm.connect()
        assert connected
        seqs = await receive_events(comm, total, timeout=20)
        thread.join()
        assert seqs == list(range(1, total + 1))
        assert await comm.receive_nothing(timeout=0.5)
        await comm.disconnect()

    async_to_sync(scenario)()


def test_private_job_is_refused_to_outsiders_and_bad_tokens() -> None:
    org = OrganizationFactory()
    model = ModelReleaseFactory(organization=org, visibility="private", released_at=None)
    job = JobFactory(model=model, organization=org)
    outsider = make_token(organization=OrganizationFactory(), scopes=[Scope.READ])
    insider = make_token(organization=org, scopes=[Scope.READ])

    async def code_for(query: str) -> int | None:
        """The close code of a refusal (accepted, then closed at once), None when the socket stays open."""
        comm = WebsocketCommunicator(application(), f"/ws/jobs/{job.pk}/{query}", headers=HEADERS)
        connected, _ = await comm.connect()
        assert connected
        first = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return first["code"] if first["type"] == "websocket.close" else None

    assert async_to_sync(code_for)(f"?token={outsider.secret}") == 4403
    assert async_to_sync(code_for)("") == 4403  # anonymous
    assert async_to_sync(code_for)("?token=nope") == 4401
    assert async_to_sync(code_for)(f"?token={insider.secret}") is None
    assert async_to_sync(code_for)(f"?token={insider.secret}&after=x") == 4400
    from apps.accounts.services import do_revoke_api_token

    do_revoke_api_token(insider)  # the API's token check holds here too
    assert async_to_sync(code_for)(f"?token={insider.secret}") == 4401


def test_matrix_socket_pushes_cell_changes_of_visible_models() -> None:
    from apps.matrix.events import broadcast_cell_changed

    org = OrganizationFactory()
    public = ModelReleaseFactory()
    private = ModelReleaseFactory(organization=org, visibility="private", released_at=None)
    viewer = make_token(organization=OrganizationFactory(), scopes=[Scope.READ])

    async def scenario() -> None:
        comm = WebsocketCommunicator(application(), f"/ws/matrix/?token={viewer.secret}", headers=HEADERS)
        connected, _ = await comm.connect()
        assert connected
        for model in (private, public):
            await _in_thread(broadcast_cell_changed, {"type": "cell.changed", "model": model.slug, "hardware": "h",
                                                      "tier": 2, "tier_name": "loads", "failed_stage": "",
                                                      "fits": True, "fits_devices": 1})
        message = await comm.receive_json_from(timeout=10)
        assert message["model"] == public.slug  # the private model's change never reached this client
        assert await comm.receive_nothing(timeout=0.5)
        await comm.disconnect()

    async_to_sync(scenario)()


async def _in_thread(fn, *args) -> None:  # noqa: ANN001
    """Runs a database write in a worker thread (as a request would) and closes that thread's connection."""
    from asgiref.sync import sync_to_async
    from django.db import connection

    def call() -> None:
        try:
            fn(*args)
        finally:
            connection.close()

    await sync_to_async(call, thread_sensitive=False)()


def test_a_signed_in_member_follows_a_private_job_with_the_session_cookie() -> None:
    from django.conf import settings
    from django.test import Client

    from apps.accounts.models import Membership
    from tests.factories import UserFactory

    org = OrganizationFactory()
    model = ModelReleaseFactory(organization=org, visibility="private", released_at=None)
    job = JobFactory(model=model, organization=org)
    store(job, 1, 2)
    member = UserFactory()
    Membership.objects.create(organization=org, user=member, role="viewer")
    browser = Client()
    browser.force_login(member)
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}".encode()

    async def scenario() -> None:
        comm = WebsocketCommunicator(application(), f"/ws/jobs/{job.pk}/", headers=[*HEADERS, (b"cookie", cookie)])
        connected, _ = await comm.connect()
        assert connected
        assert await receive_events(comm, 2) == [1, 2]
        await comm.disconnect()

    async_to_sync(scenario)()


def store_node(job: Job, node: int, count: int) -> None:
    """``count`` more events of node ``node``'s sequence, appended as the portal does on its node's report."""
    from django.db import transaction

    from apps.jobs.node_services import append_node_stream

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=job.pk)
        append_node_stream(job.pk, node, [{"ts": datetime.now(UTC).isoformat(), "stage": "load",
                                           "kind": "stage_finished", "level": "info", "message": f"node {node}",
                                           "data": None} for _ in range(count)])


async def receive_all(comm: WebsocketCommunicator, count: int, timeout: float = 10) -> dict[int, list[int]]:
    """{node: seqs} of the first ``count`` events received (node 0: ``job.events``), then nothing more."""
    seqs: dict[int, list[int]] = {}
    while sum(map(len, seqs.values())) < count:
        message = await comm.receive_json_from(timeout=timeout)
        if message["type"] == "job.events":
            seqs.setdefault(0, []).extend(e["seq"] for e in message["events"])
        elif message["type"] == "job.node_events":
            seqs.setdefault(message["node"], []).extend(e["seq"] for e in message["node_events"])
    assert await comm.receive_nothing(timeout=0.5)
    return seqs


def test_other_nodes_stream_their_own_sequences_beside_node_0s(job_and_token) -> None:  # noqa: ANN001
    job, token = job_and_token
    store(job, 1, 2, 3)
    store_node(job, 1, 2)
    store_node(job, 2, 1)

    async def scenario() -> None:
        url = f"/ws/jobs/{job.pk}/?after=1&nodes_after=1:1&token={token.secret}"
        comm = WebsocketCommunicator(application(), url, headers=HEADERS)
        connected, _ = await comm.connect()
        assert connected
        assert await receive_all(comm, 4) == {0: [2, 3], 1: [2], 2: [1]}  # node 2 from its start
        await _in_thread(store_node, job, 1, 2)
        await _in_thread(store, job, 4)
        assert await receive_all(comm, 3) == {1: [3, 4], 0: [4]}
        await comm.disconnect()
        # a client that never asks for nodes_after gets every node's sequence replayed from its start
        comm = WebsocketCommunicator(application(), f"/ws/jobs/{job.pk}/?after=4&token={token.secret}",
                                     headers=HEADERS)
        assert (await comm.connect())[0]
        assert await receive_all(comm, 5) == {1: [1, 2, 3, 4], 2: [1]}
        await comm.disconnect()

    async_to_sync(scenario)()


@pytest.mark.parametrize("cursors", ["1", "0:3", "1:-1", "x:1", "1:2,1:3",
                                     ",".join(f"{n}:0" for n in range(1, 1100))])
def test_a_malformed_nodes_after_is_refused_with_4400(job_and_token, cursors) -> None:  # noqa: ANN001
    job, token = job_and_token

    async def code() -> int | None:
        comm = WebsocketCommunicator(application(), f"/ws/jobs/{job.pk}/?nodes_after={cursors}&token={token.secret}",
                                     headers=HEADERS)
        await comm.connect()
        first = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return first["code"] if first["type"] == "websocket.close" else None

    assert async_to_sync(code)() == 4400
