"""WebSockets and revocation: refusals are close codes after an accepted handshake, and a
revoked token's open sockets are closed — at once through the token's group, and within ``TOKEN_RECHECK_S``
even when that broadcast is lost. Real ASGI application, Redis channel layer, PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from apps.accounts.choices import Scope
from apps.accounts.models import ApiToken
from apps.accounts.services import do_revoke_api_token
from apps.jobs import consumers, eventlog
from apps.jobs.models import Job
from tests.factories import JobFactory, ModelReleaseFactory, OrganizationFactory, make_token

pytestmark = pytest.mark.django_db(transaction=True)
HEADERS = [(b"origin", b"http://localhost"), (b"host", b"localhost")]


def _store(job: Job, *seqs: int) -> None:
    eventlog.do_store_job_events(job, [{"seq": s, "ts": datetime.now(UTC), "stage": "load", "kind": "log",
                                        "level": "info", "message": str(s), "data": None} for s in seqs])


def _application():  # noqa: ANN202
    from day0portal.asgi import application

    return application


async def _next_event_or_close(comm: WebsocketCommunicator, timeout: float = 5) -> dict:
    while True:
        output = await comm.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return output
        message = json.loads(output["text"])
        if message["type"] == "job.events":
            return message


@pytest.mark.parametrize("path", ["jobs", "matrix"])
def test_a_revoked_tokens_open_socket_is_closed_with_4401_at_once(path: str) -> None:
    job = JobFactory()
    token = make_token(organization=job.organization, scopes=[Scope.READ])
    url = f"/ws/jobs/{job.pk}/?token={token.secret}" if path == "jobs" else f"/ws/matrix/?token={token.secret}"

    async def scenario() -> None:
        comm = WebsocketCommunicator(_application(), url, headers=HEADERS)
        assert (await comm.connect())[0]
        if path == "jobs":
            await comm.receive_json_from(timeout=5)  # job.state
            await sync_to_async(_store)(job, 1)
            assert (await _next_event_or_close(comm))["events"][0]["seq"] == 1
        started = asyncio.get_running_loop().time()
        await sync_to_async(do_revoke_api_token)(token)
        closed = await comm.receive_output(timeout=3)
        assert closed == {"type": "websocket.close", "code": 4401}
        assert asyncio.get_running_loop().time() - started < 3
        await comm.disconnect()

    async_to_sync(scenario)()


def _revoke_silently(token: ApiToken) -> None:
    """Revoked without the broadcast (a bulk update, a process that died before on_commit ran)."""
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())


def _deactivate_user(token: ApiToken) -> None:
    token.user.is_active = False
    token.user.save()


@pytest.mark.parametrize("invalidate", [_revoke_silently, _deactivate_user])
def test_a_token_made_unusable_without_a_broadcast_stops_the_stream_within_the_recheck_bound(monkeypatch,
                                                                                            invalidate) -> None:
    monkeypatch.setattr(consumers, "TOKEN_RECHECK_S", 0.2)
    job = JobFactory()
    token = make_token(organization=job.organization, scopes=[Scope.READ])

    async def scenario() -> None:
        comm = WebsocketCommunicator(_application(), f"/ws/jobs/{job.pk}/?token={token.secret}", headers=HEADERS)
        assert (await comm.connect())[0]
        await comm.receive_json_from(timeout=5)
        await sync_to_async(_store)(job, 1)
        assert (await _next_event_or_close(comm))["type"] == "job.events"  # delivered while the token is good
        await sync_to_async(invalidate)(token)
        await asyncio.sleep(0.3)
        await sync_to_async(_store)(job, 2)
        assert await _next_event_or_close(comm) == {"type": "websocket.close", "code": 4401}
        await comm.disconnect()

    async_to_sync(scenario)()


def test_refusals_are_documented_close_codes_after_an_accepted_handshake() -> None:
    org = OrganizationFactory()
    job = JobFactory(model=ModelReleaseFactory(organization=org, visibility="private", released_at=None),
                     organization=org)
    outsider = make_token(organization=OrganizationFactory(), scopes=[Scope.READ])

    async def first_output(url: str) -> dict:
        comm = WebsocketCommunicator(_application(), url, headers=HEADERS)
        connected, _ = await comm.connect()
        assert connected  # a handshake refused with HTTP 403 would hide the reason from a browser
        output = await comm.receive_output(timeout=5)
        await comm.disconnect()
        return output

    cases = {f"/ws/jobs/{job.pk}/?token=nope": 4401, f"/ws/jobs/{job.pk}/?token={outsider.secret}": 4403,
             f"/ws/jobs/{job.pk + 1000}/": 4404, f"/ws/jobs/{job.pk}/?after=x": 4400, "/ws/matrix/?token=nope": 4401}
    for url, code in cases.items():
        assert async_to_sync(first_output)(url) == {"type": "websocket.close", "code": code}, url
