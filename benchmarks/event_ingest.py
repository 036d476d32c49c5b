"""Event ingest: events persisted per second when agents post batches to ``/api/v1/jobs/{id}/events/``.

Runs against the database the environment selects (``DAY0_DATABASE_URL``: PostgreSQL, in a throwaway
``test_<name>_ingest`` database; unset: the embedded SQLite under a temporary data folder). Rows: the whole REST path (DRF view, token authentication, validation,
idempotent store, highest contiguous seq) in batches, the service alone, and the peer — one event per request,
as an agent without batching would post — side by side. Target: ≥ 10,000 events/s persisted in batches.

    DAY0_DATABASE_URL=postgres://postgres@127.0.0.1:5432/day0 .venv/bin/python benchmarks/event_ingest.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _throwaway_db import use_throwaway_database  # noqa: E402  (benchmarks/ is the script's folder)

TARGET = 10_000


def setup_django() -> None:
    if not os.environ.get("DAY0_DATABASE_URL"):
        os.environ.setdefault("DAY0_DATA_DIR", tempfile.mkdtemp(prefix="day0-ingest-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")
    os.environ.setdefault("DAY0_ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        use_throwaway_database("ingest")
        return
    call_command("migrate", verbosity=0, interactive=False)


def events(first: int, count: int) -> list[dict]:
    ts = datetime.now(UTC).isoformat()
    return [{"seq": s, "ts": ts, "stage": "load", "kind": "progress", "level": "info",
             "message": f"tensors loaded: {s}/{first + count - 1}", "data": {"done": s, "total": first + count - 1}}
            for s in range(first, first + count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--peer-events", type=int, default=1000, help="events posted one per request")
    args = parser.parse_args()
    setup_django()

    from django.conf import settings
    from rest_framework.test import APIClient

    from apps.accounts.choices import Scope
    from apps.accounts.models import Organization
    from apps.accounts.services import do_create_api_token
    from apps.catalog.models import Hardware
    from apps.catalog.services import do_create_hardware, do_create_model_release
    from apps.jobs import eventlog
    from apps.jobs.models import Job, JobEvent

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    tag = f"bench{os.getpid()}"
    org = Organization.objects.create(slug=tag, name=tag)
    from django.contrib.auth import get_user_model

    from apps.accounts.models import Membership

    user = get_user_model().objects.create(username=tag)
    Membership.objects.create(organization=org, user=user, role="admin")  # a token works while its user is a member
    hardware = do_create_hardware(slug=tag, vendor="bench", name=tag, memory_bytes=8 * 10**9, devices_per_node=1,
                                  dtypes=["float32"])
    model = do_create_model_release(slug=tag, name=tag, organization=org, visibility="public", modalities=["text"],
                                    config={"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                            "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
                                            "num_hidden_layers": 2, "num_attention_heads": 4,
                                            "num_key_value_heads": 2, "max_position_embeddings": 256})
    _, secret = do_create_api_token(organization=org, user=user, name=tag, scopes=[Scope.AGENT],
                                    hardware_id=hardware.pk)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    rows: list[tuple[str, int, int, float]] = []
    try:
        def new_job() -> Job:
            return Job.objects.create(model=model, hardware=hardware, organization=org, spec={}, state="running")

        warm = new_job()  # first requests import and connect lazily: not part of the measurement
        for start in (1, 11):
            client.post(f"/api/v1/jobs/{warm.pk}/events/", {"events": events(start, 10)}, format="json")
        job = new_job()
        # bodies encoded up front, as the agent (another process) sends them: the timer sees only the portal
        bodies = [json.dumps({"events": events(start, min(args.batch, args.events - start + 1))})
                  for start in range(1, args.events + 1, args.batch)]
        t0 = time.perf_counter()
        for body in bodies:
            response = client.post(f"/api/v1/jobs/{job.pk}/events/", body, content_type="application/json")
            assert response.status_code == 200, response.content
        rest_s = time.perf_counter() - t0
        assert response.json()["acked"] == args.events and JobEvent.objects.filter(job=job).count() == args.events
        rows.append((f"REST, batches of {args.batch}", args.events, args.batch, rest_s))

        job = new_job()
        t0 = time.perf_counter()
        for start in range(1, args.events + 1, args.batch):
            batch = eventlog.parse_event_batch(events(start, min(args.batch, args.events - start + 1)),
                                               max_events=settings.EVENT_BATCH_MAX)
            eventlog.do_store_job_events(job, batch)
        rows.append((f"service, batches of {args.batch}", args.events, args.batch, time.perf_counter() - t0))

        job = new_job()
        t0 = time.perf_counter()
        for seq in range(1, args.peer_events + 1):
            response = client.post(f"/api/v1/jobs/{job.pk}/events/", {"events": events(seq, 1)}, format="json")
            assert response.status_code == 200
        rows.append(("peer: REST, one event per request", args.peer_events, 1, time.perf_counter() - t0))
    finally:
        JobEvent.objects.filter(job__hardware=hardware).delete()
        Job.objects.filter(hardware=hardware).delete()
        model.delete()
        Hardware.objects.filter(pk=hardware.pk).delete()
        org.delete()
        user.delete()

    print(f"\nevent ingest on {engine} (events persisted, highest contiguous seq answered)\n")
    print(f"{'path':<36} {'events':>8} {'batch':>6} {'seconds':>8} {'events/s':>10}")
    for name, n, batch, seconds in rows:
        print(f"{name:<36} {n:>8} {batch:>6} {seconds:>8.2f} {n / seconds:>10.0f}")
    rest_rate = rows[0][1] / rows[0][3]
    print(f"\ntarget ≥ {TARGET} events/s through REST in batches: {'PASS' if rest_rate >= TARGET else 'FAIL'} "
          f"({rest_rate:.0f}/s; {rest_rate / (rows[2][1] / rows[2][3]):.0f}× the one-per-request peer)")
    return 0 if rest_rate >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
