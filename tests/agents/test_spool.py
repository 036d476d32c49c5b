"""The agent's event spool against a real portal that goes away: nothing lost, nothing duplicated, in order."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agents.worker.client import PortalClient
from agents.worker.spool import JobSpool, SpoolSender
from apps.accounts.choices import Scope
from apps.jobs.eventlog import parse_event_batch
from apps.jobs.models import Job, JobEvent
from contract.events import EVENT_MESSAGE_MAX
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
    reopened.close(remove_if_acked=False)
    assert [e["seq"] for e in JobSpool(tmp_path, 7).pending(100)] == [3, 4, 5, 6]  # not glued to the torn line
    assert JobSpool(tmp_path, 7, portal_acked=10).append(stage="", kind="log", message="x") == 11  # portal knows more


def test_a_message_longer_than_the_portal_takes_is_cut_to_its_bound(tmp_path: Path) -> None:
    """The portal refuses an event message past ``EVENT_MESSAGE_MAX`` (a batch it refuses stops the sender), so the
    spool cuts a longer one (a long traceback) to the bound instead of losing the log."""
    spool = JobSpool(tmp_path, 8)
    spool.append(stage="load", kind="log", message="x" * (EVENT_MESSAGE_MAX + 10))
    (event,) = spool.pending(10)
    assert len(event["message"]) == EVENT_MESSAGE_MAX
    assert parse_event_batch([event], max_events=1)[0]["message"] == event["message"]
    spool.close(remove_if_acked=False)


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


# --- one portal, one agent: spools keyed by both -----------------------------------------------------------


def test_spool_and_work_folders_are_keyed_by_portal_and_agent_under_the_data_dir(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    from agents.worker.agent_state import AgentState

    monkeypatch.setenv("DAY0_DATA_DIR", str(tmp_path))
    for name in ("DAY0_AGENT_SPOOL_DIR", "DAY0_AGENT_WORK_DIR"):
        monkeypatch.delenv(name, raising=False)
    first = AgentState(portal_url="http://127.0.0.1:8000", hardware="cpu", hostname="box")
    other_portal = AgentState(portal_url="http://127.0.0.1:8001", hardware="cpu", hostname="box")
    other_agent = AgentState(portal_url="http://127.0.0.1:8000", hardware="cpu", hostname="box2")
    folders = {first.spool_dir, other_portal.spool_dir, other_agent.spool_dir, first.work_dir}
    assert len(folders) == 4 and all(f.is_relative_to(tmp_path / "agent") for f in folders)
    assert first.spool_dir.parent.name.startswith("127.0.0.1_8000-") and first.spool_dir.name == "cpu@box"


def test_files_of_another_job_with_the_same_id_are_set_aside_not_sent(tmp_path: Path) -> None:
    old = JobSpool(tmp_path, 1, identity="portal A job 1")
    append(old, 1, 12)
    old.close(remove_if_acked=False)
    fresh = JobSpool(tmp_path, 1, portal_acked=0, identity="portal B job 1")
    assert fresh.pending(100) == [] and fresh.append(stage="", kind="log", message="mine") == 1
    assert len(list((tmp_path / "stale").glob("job-1.events.jsonl.*"))) == 1


# --- a spool the portal cannot accept: reconciled, or failed loudly (once: 10,531 re-posts) ----------------------


@pytest.fixture
def live_portal() -> PortalProcess:  # noqa: ANN201
    portal = PortalProcess()
    portal.start()
    yield portal
    portal.stop()


def test_events_the_portal_misses_are_resent_from_the_file(tmp_path: Path, live_portal: PortalProcess) -> None:
    job = JobFactory()
    token = make_token(organization=job.organization, scopes=[Scope.AGENT], hardware=job.hardware)
    spool = JobSpool(tmp_path, job.pk)
    append(spool, 1, 20)
    spool.mark_acked(20)  # the spool believes everything was stored; the portal holds nothing
    spool.close(remove_if_acked=False)
    with PortalClient(live_portal.url, token.secret, timeout=5) as client:
        spool = JobSpool(tmp_path, job.pk)
        append(spool, 21, 25)
        sender = SpoolSender(spool, client.post_events, interval=0.05).start()
        try:
            assert sender.flush(20), sender.last_error
        finally:
            sender.stop()
    assert stored(job) == list(range(1, 26)) and sender.fatal is None


def test_a_spool_whose_events_are_gone_stops_after_one_post_instead_of_looping(tmp_path: Path,
                                                                               live_portal: PortalProcess) -> None:
    """Two demos shared a spool: this job's file holds seqs 13-20 and says 12 were acknowledged, the portal holds
    none. Before, the agent re-posted the batch every 50 ms for ever (10,531 times in 12.5 minutes)."""
    job = JobFactory()
    token = make_token(organization=job.organization, scopes=[Scope.AGENT], hardware=job.hardware)
    spool = JobSpool(tmp_path, job.pk)
    spool.mark_acked(12)
    spool.close(remove_if_acked=False)
    spool = JobSpool(tmp_path, job.pk)
    append(spool, 13, 20)
    with PortalClient(live_portal.url, token.secret, timeout=5) as client:
        sender = SpoolSender(spool, client.post_events, interval=0.05).start()
        started = time.monotonic()
        try:
            assert sender.flush(10) is False
            assert time.monotonic() - started < 3  # flush gives up as soon as the sender does
            time.sleep(1.0)
        finally:
            sender.stop()
    assert sender.posts == 1, sender.posts
    assert sender.fatal and "up to seq 0" in sender.fatal and "seqs 1-12" in sender.fatal
    assert stored(job) == list(range(13, 21)) and Job.objects.get(pk=job.pk).events_acked == 0


# --- retry storms: the portal is down, POSTs stay few -------------------------------------------------------


class CountingDownPortal:
    """An HTTP server that answers every request 503 (a portal down behind its proxy) and counts them."""

    def __init__(self) -> None:
        import http.server
        import threading

        counter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                counter.posts += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self.posts = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("down", ["503", "refused"])
def test_with_the_portal_down_posts_per_second_stay_bounded_while_events_and_flushes_keep_coming(
        tmp_path: Path, down: str) -> None:
    import threading

    from tests.live_services import free_port

    counting = CountingDownPortal() if down == "503" else None
    url = counting.url if counting else f"http://127.0.0.1:{free_port()}"
    client = PortalClient(url, "token", timeout=2)
    spool = JobSpool(tmp_path, 1)
    sender = SpoolSender(spool, client.post_events, interval=0.2, max_backoff=5.0).start()
    stop = threading.Event()

    def produce() -> None:  # a stage emitting events (each wakes the sender) while the job ends (flush)
        while not stop.is_set():
            spool.append(stage="load", kind="log", message="tick")
            sender.wake()
            time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        assert sender.flush(4.5) is False
    finally:
        stop.set()
        producer.join()
        sender.stop()
        client.close()
        if counting:
            counting.close()
    posts = counting.posts if counting else sender.posts
    # backoff 0.4, 0.8, 1.6, 3.2 s (jittered): about 4 tries in 4.5 s, where the 50 ms wake-ups made ~300
    assert 2 <= posts <= 7, posts
    assert spool.pending_count() > 100  # nothing was dropped meanwhile
