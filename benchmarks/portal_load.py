"""The portal under load, as production runs it: PostgreSQL (a throwaway database), Redis (Celery broker and
channel layer), uvicorn with several workers, a Celery worker; 200 WebSocket clients following jobs while an
open-loop client sends 50 API requests a second (agents posting event batches, readers listing the matrix,
jobs and events). Bounded in time. Reports request latency p50/p99 per kind, errors, WebSocket connects and
refusals, event delivery latency, and events delivered versus stored: every client must receive every stored
event of its job exactly once, in order.

    DAY0_DATABASE_URL=postgres://… DAY0_REDIS_URL=redis://… .venv/bin/python benchmarks/portal_load.py \
        [--clients 200] [--rate 50] [--seconds 30] [--jobs 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EVENTS_PER_BATCH = 5
DRAIN_SECONDS = 60.0
TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
               "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
               "num_key_value_heads": 4, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}


@dataclass
class World:
    base: str
    job_ids: list[int]
    reader: str
    agent: str
    db_url: str


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    error_samples: list[str] = field(default_factory=list)
    sent_at: dict[tuple[int, int], float] = field(default_factory=dict)  # (job, seq) -> when its POST left
    delivery: list[float] = field(default_factory=list)
    ws_connected: int = 0
    ws_failed: int = 0
    ws_closed_early: int = 0

    def error(self, kind: str, what: str) -> None:
        self.errors[kind] += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(f"{kind}: {what}")


def build_world(jobs: int, port: int) -> World:
    """Organization, admin, reader and agent tokens, an owned hardware, one model and ``jobs`` running jobs."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")
    django.setup()
    from benchmarks._throwaway_db import use_throwaway_database

    if not use_throwaway_database(f"load_{os.getpid()}"):
        raise SystemExit(2)
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from apps.accounts.choices import Role
    from apps.accounts.services import do_create_api_token, do_create_organization, do_set_membership
    from apps.catalog.services import do_create_hardware, do_create_model_release
    from apps.jobs.choices import JobState
    from apps.jobs.models import Job

    org = do_create_organization(slug="load", name="Load")
    user = get_user_model().objects.create_user("loadadmin")
    do_set_membership(org, user, Role.ADMIN)
    hardware = do_create_hardware(slug="load-npu", organization=org, vendor="Acme", name="Acme NPU",
                                  memory_bytes=80 * 10**9, devices_per_node=8, dtypes=["bfloat16"])
    model = do_create_model_release(slug="load-model", name="Load model", organization=org, config=TINY_CONFIG)
    rows = [Job.objects.create(model=model, hardware=hardware, organization=org, state=JobState.RUNNING,
                               spec={"stages": ["plan"], "dtype": "bfloat16"}) for _ in range(jobs)]
    _, reader = do_create_api_token(organization=org, user=user, name="reader", scopes=["read"])
    _, agent = do_create_api_token(organization=org, user=user, name="agent", scopes=["agent"],
                                   hardware_id=hardware.pk)
    db = settings.DATABASES["default"]
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    db_url = f"postgres://{db.get('USER') or 'postgres'}{password}@{db.get('HOST') or '127.0.0.1'}:" \
             f"{db.get('PORT') or 5432}/{db['NAME']}"
    return World(f"http://127.0.0.1:{port}", [j.pk for j in rows], reader, agent, db_url)


def start_servers(world: World, port: int, workers: int, prefix: str) -> list[subprocess.Popen]:
    env = {**os.environ, "DAY0_DATABASE_URL": world.db_url, "DAY0_CHANNELS_PREFIX": prefix,
           "DAY0_LOG_LEVEL": "WARNING", "DJANGO_SETTINGS_MODULE": "day0portal.settings"}
    bin_dir = Path(sys.executable).parent
    web = subprocess.Popen([str(bin_dir / "uvicorn"), "day0portal.asgi:application", "--host", "127.0.0.1",
                            "--port", str(port), "--workers", str(workers), "--log-level", "warning",
                            "--no-access-log"], cwd=ROOT, env=env, start_new_session=True)
    celery = subprocess.Popen([str(bin_dir / "celery"), "-A", "day0portal", "worker", "-Q", "portal",
                               "--concurrency", "2", "--loglevel", "WARNING", "-n", f"load-{prefix}@%h"],
                              cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    return [web, celery]


def stop_servers(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


async def wait_ready(base: str, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(f"{base}/readyz", timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.3)
    raise SystemExit("the portal did not become ready")


async def follow(world: World, job_id: int, stats: Stats, received: list[int], stop: asyncio.Event) -> None:
    """One WebSocket client of ``/ws/jobs/<id>/``: records every event seq it receives."""
    from websockets.asyncio.client import connect

    url = world.base.replace("http", "ws") + f"/ws/jobs/{job_id}/?after=0&token={world.reader}"
    try:
        async with connect(url, origin=world.base, open_timeout=30, max_size=None) as ws:
            stats.ws_connected += 1
            while not stop.is_set():
                try:
                    raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                message = json.loads(raw)
                if message.get("type") != "job.events":
                    continue
                now = time.monotonic()
                for event in message["events"]:
                    received.append(event["seq"])
                    sent = stats.sent_at.get((job_id, event["seq"]))
                    if sent is not None:
                        stats.delivery.append(now - sent)
    except Exception as exc:  # noqa: BLE001 - a benchmark counts failures, it does not stop on them
        if stats.ws_connected and not stop.is_set():
            stats.ws_closed_early += 1
        else:
            stats.ws_failed += 1
        stats.error("websocket", f"{type(exc).__name__}: {exc}")


async def api_load(world: World, rate: float, seconds: float, stats: Stats) -> dict[int, int]:
    """Open loop: ``rate`` requests a second for ``seconds``, each started on schedule whatever the previous
    ones are doing. 40 % are agent event batches (seqs contiguous per job), the rest reads."""
    import httpx

    rng = random.Random(16)
    next_seq: dict[int, int] = defaultdict(lambda: 1)
    reader = {"Authorization": f"Token {world.reader}"}
    agent = {"Authorization": f"Token {world.agent}", "Content-Type": "application/json"}
    # idle connections expire before uvicorn's 5 s keep-alive closes them (else a reuse races the close)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=100, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=world.base, timeout=30, limits=limits) as client:

        async def one(kind: str, method: str, url: str, **kwargs: Any) -> None:
            t0 = time.monotonic()
            try:
                response = await client.request(method, url, **kwargs)
                if response.status_code >= 400:
                    stats.error(kind, f"{method} {url} -> {response.status_code} {response.text[:200]}")
            except httpx.HTTPError as exc:
                stats.error(kind, f"{method} {url}: {type(exc).__name__}: {exc}")
            stats.latencies[kind].append(time.monotonic() - t0)

        tasks = []
        started = time.monotonic()
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            job_id = rng.choice(world.job_ids)
            pick = rng.random()
            if pick < 0.4:
                first = next_seq[job_id]
                next_seq[job_id] = first + EVENTS_PER_BATCH
                now = time.monotonic()
                events = []
                for seq in range(first, first + EVENTS_PER_BATCH):
                    stats.sent_at[(job_id, seq)] = now
                    events.append({"seq": seq, "ts": "2026-12-01T00:00:00Z", "stage": "load", "kind": "progress",
                                   "level": "info", "message": f"step {seq}", "data": {"done": seq}})
                call = one("POST events", "POST", f"/api/v1/jobs/{job_id}/events/", content=json.dumps(events),
                           headers=agent)
            elif pick < 0.6:
                call = one("GET matrix", "GET", "/api/v1/matrix/", headers=reader)
            elif pick < 0.8:
                call = one("GET jobs", "GET", "/api/v1/jobs/?page_size=20", headers=reader)
            else:
                call = one("GET events", "GET", f"/api/v1/jobs/{job_id}/events/?after=0&limit=100", headers=reader)
            tasks.append(asyncio.create_task(call))
        await asyncio.gather(*tasks)
    return {job: seq - 1 for job, seq in next_seq.items()}


def stored_seqs(job_ids: list[int]) -> dict[int, list[int]]:
    """Every stored event seq of each job (also called from a worker thread: its connection is closed after)."""
    from django.db import connection

    from apps.jobs.models import JobEvent

    out: dict[int, list[int]] = {job: [] for job in job_ids}
    try:
        rows = JobEvent.objects.filter(job_id__in=job_ids).order_by("job_id", "seq").values_list("job_id", "seq")
        for job, seq in rows:
            out[job].append(seq)
    finally:
        connection.close()
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def refusal_codes(world: World) -> dict[str, Any]:
    """Close codes a real server sends for refusals (after an accepted handshake, not an HTTP 403)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    out: dict[str, Any] = {}
    for name, query in (("bad token", "?token=nope"), ("bad after", f"?after=x&token={world.reader}")):
        url = world.base.replace("http", "ws") + f"/ws/jobs/{world.job_ids[0]}/{query}"
        try:
            async with connect(url, origin=world.base) as ws:
                await ws.recv()
        except ConnectionClosed as exc:
            out[name] = exc.rcvd.code if exc.rcvd else None
        except InvalidStatus as exc:
            out[name] = f"HTTP {exc.response.status_code}"
    return out


async def run(world: World, clients: int, rate: float, seconds: float) -> tuple[Stats, dict, dict, float]:
    stats = Stats()
    stop = asyncio.Event()
    received: list[list[int]] = [[] for _ in range(clients)]
    owners = [world.job_ids[i % len(world.job_ids)] for i in range(clients)]
    followers = [asyncio.create_task(follow(world, owners[i], stats, received[i], stop)) for i in range(clients)]
    t0 = time.monotonic()
    while stats.ws_connected + stats.ws_failed < clients and time.monotonic() - t0 < 60:
        await asyncio.sleep(0.1)
    connect_seconds = time.monotonic() - t0
    sent = await api_load(world, rate, seconds, stats)
    stored = await asyncio.to_thread(stored_seqs, world.job_ids)
    expected = sum(len(stored[job]) for job in owners)
    drain_until = time.monotonic() + DRAIN_SECONDS  # the last broadcasts are still on their way
    while time.monotonic() < drain_until and sum(len(r) for r in received) < expected:
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.5)  # anything beyond the expected count (a duplicate) arrives too
    stop.set()
    await asyncio.gather(*followers)
    codes = await refusal_codes(world)
    return stats, {"received": received, "owners": owners, "sent": sent}, codes, connect_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0, help="API requests per second")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers (the docker default)")
    args = parser.parse_args()
    if not os.environ.get("DAY0_REDIS_URL") or not os.environ.get("DAY0_DATABASE_URL"):
        raise SystemExit("set DAY0_DATABASE_URL (PostgreSQL) and DAY0_REDIS_URL (Redis): production settings")
    from tests.live_services import free_port

    port = free_port()
    prefix = f"day0load{uuid.uuid4().hex[:8]}"
    os.environ["DAY0_CHANNELS_PREFIX"] = prefix
    world = build_world(args.jobs, port)
    processes = start_servers(world, port, args.workers, prefix)
    try:
        asyncio.run(wait_ready(world.base))
        stats, got, codes, connect_seconds = asyncio.run(run(world, args.clients, args.rate, args.seconds))
    finally:
        stop_servers(processes)
    stored = stored_seqs(world.job_ids)
    lost = duplicated = out_of_order = delivered = 0
    for seqs, job in zip(got["received"], got["owners"], strict=True):
        delivered += len(seqs)
        want = stored[job]
        lost += len(set(want) - set(seqs))
        duplicated += len(seqs) - len(set(seqs))
        out_of_order += int(seqs != sorted(seqs))
    stored_total = sum(len(v) for v in stored.values())
    posted = sum(got["sent"].values())
    print(f"\nportal load: {args.clients} WebSocket clients on {args.jobs} jobs, {args.rate:g} API requests/s for "
          f"{args.seconds:g} s; uvicorn x{args.workers}, Celery worker, PostgreSQL, Redis\n")
    print(f"{'requests':<14}{'count':>7}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    everything: list[float] = []
    for kind in sorted(stats.latencies):
        values = stats.latencies[kind]
        everything += values
        print(f"{kind:<14}{len(values):>7}{stats.errors.get(kind, 0):>8}{pct(values, 50) * 1000:>9.1f}"
              f"{pct(values, 99) * 1000:>9.1f}{max(values) * 1000:>9.1f}")
    api_errors = sum(v for k, v in stats.errors.items() if k != "websocket")
    print(f"{'all':<14}{len(everything):>7}{api_errors:>8}{pct(everything, 50) * 1000:>9.1f}"
          f"{pct(everything, 99) * 1000:>9.1f}{max(everything) * 1000:>9.1f}")
    achieved = len(everything) / args.seconds
    print(f"\nachieved request rate: {achieved:.1f}/s (target {args.rate:g}/s)")
    print(f"websockets: {stats.ws_connected} connected in {connect_seconds:.1f} s, {stats.ws_failed} failed to "
          f"connect, {stats.ws_closed_early} closed early; refusals over the real server: {codes}")
    print(f"events: {posted} posted, {stored_total} stored, {delivered} delivered to clients "
          f"(expected {sum(len(stored[j]) for j in got['owners'])}); lost {lost}, duplicated {duplicated}, "
          f"clients out of order {out_of_order}")
    if stats.delivery:
        print(f"event delivery latency (POST sent -> client received): p50 {pct(stats.delivery, 50) * 1000:.1f} ms, "
              f"p99 {pct(stats.delivery, 99) * 1000:.1f} ms")
    for sample in stats.error_samples:
        print("  error:", sample)
    ok = (api_errors == 0 and stats.ws_failed == 0 and stats.ws_closed_early == 0 and lost == 0
          and duplicated == 0 and stored_total == posted)
    print("\nRESULT:", "PASS" if ok else "FAIL")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
