"""Portal speed: the matrix page and ``GET /api/v1/matrix/`` at 200 models × 40 hardware × 20 jobs per cell,
and event ingest through ``POST /api/v1/jobs/{id}/events/`` in batches of 500, each beside a naive peer.

Goals: the page under 100 ms with a first paint under 500 KB of HTML, the API under 50 ms. Each is measured as
served (the rendered grid or JSON cached until the matrix changes) and cold (the matrix version bumped before
each request, as a cell change does): the cold figures are what the first reader after a change waits. The API
is measured a third way: one cell written (an UPDATE, then the version replaced) before each request.

Runs on PostgreSQL in a throwaway database (``test_<name>_bench``), created and dropped here:

    DAY0_DATABASE_URL=postgres://postgres@127.0.0.1:5432/day0 .venv/bin/python benchmarks/portal_matrix.py
    ... --models 50 --hardware 10 --jobs 5      (smaller)

Server time is measured in-process through Django's test client (the full middleware, auth, view, template
and JSON rendering; no network), as wall time and as this process's CPU time. Query counts come from
``CaptureQueriesContext``."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _throwaway_db import use_throwaway_database  # noqa: E402  (benchmarks/ is the script's folder)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")


def _timed(fn, repeat: int, setup=None) -> tuple[float, float]:  # noqa: ANN001
    """Median wall ms and median CPU ms of this process (the server's own work; on a busy machine wall time
    also counts waiting for a core); ``setup`` runs before each, untimed."""
    wall, cpu = [], []
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def _naive_matrix_json() -> None:
    """The peer: one query per model row for its cells (the usual N+1 a template loop produces)."""
    import json

    from apps.catalog.models import Hardware, ModelRelease
    from apps.matrix.models import Cell

    hardware = list(Hardware.objects.all())
    rows = []
    for m in ModelRelease.objects.all():
        cells = {c.hardware.slug: {"tier": c.tier, "fits": c.fits} for c in Cell.objects.filter(model=m).select_related("hardware")}
        rows.append({"slug": m.slug, "cells": cells})
    json.dumps({"hardware": [h.slug for h in hardware], "models": rows})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--hardware", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=20, help="jobs (with evidence) per cell")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection, reset_queries, transaction
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    if not use_throwaway_database("bench"):
        return 2
    from apps.jobs.models import Job, JobEvent
    from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, make_token
    from tests.portal.bulk import build_matrix

    t0 = time.perf_counter()
    build_matrix(args.models, args.hardware, args.jobs, tag="bench")
    print(f"data: {args.models} models × {args.hardware} hardware = {args.models * args.hardware} cells, "
          f"{Job.objects.count()} jobs with evidence (built in {time.perf_counter() - t0:.1f} s)\n")

    from django.db.models import F

    from apps.matrix.grid_cache import bump, matrix_changed
    from apps.matrix.models import Cell

    cell_ids = iter(list(Cell.objects.order_by("?").values_list("pk", flat=True)) * 2)

    def change_a_cell() -> None:
        """One cell written as the portal's writers do (an UPDATE, then the matrix version replaced)."""
        Cell.objects.filter(pk=next(cell_ids)).update(job_count=F("job_count") + 1)
        matrix_changed()

    client = Client()
    rows = []
    # (label, url, before each request, goal ms, goal bytes); "cold": the version bumped before each request (the
    # first reader after any change waits this), "a cell changed": one cell written before each request
    requests = (("matrix page  GET / (cached)", "/", None, 100, 500_000),
                ("matrix page  GET / (cold)", "/", bump, 100, 500_000),
                ("matrix page  GET /?page=10", "/?page=10", None, 100, 500_000),
                ("matrix API   GET /api/v1/matrix/ (cached)", "/api/v1/matrix/", None, 50, None),
                ("matrix API   GET /api/v1/matrix/ (cold)", "/api/v1/matrix/", bump, 50, None),
                ("matrix API   GET /api/v1/matrix/ (a cell changed)", "/api/v1/matrix/", change_a_cell, 50, None))
    for label, url, before, goal_ms, goal_bytes in requests:
        client.get(url)  # warm
        if before is not None:
            before()
        reset_queries()  # each request resets the log; start the capture from an empty one
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(url)
        assert response.status_code == 200
        queries = len(ctx.captured_queries)  # read now: later requests reset the log it slices
        median, cpu = _timed(lambda u=url: client.get(u), args.repeat, before)
        rows.append((label, median, cpu, queries, len(response.content), goal_ms, goal_bytes))
    reset_queries()
    with CaptureQueriesContext(connection) as ctx:
        _naive_matrix_json()
    queries = len(ctx.captured_queries)
    median, cpu = _timed(_naive_matrix_json, max(1, args.repeat // 2))
    rows.append(("peer: N+1 per model row (JSON)", median, cpu, queries, 0, None, None))

    print(f"{'request':<50} {'wall ms':>8} {'goal':>6} {'CPU ms':>7} {'queries':>8} {'KB':>8} {'goal':>6}   (medians)")
    for label, median, cpu, queries, size, goal_ms, goal_bytes in rows:
        ms_goal = f"<{goal_ms}" if goal_ms else ""
        kb_goal = f"<{goal_bytes // 1000}" if goal_bytes else ""
        kb = f"{size / 1000:.0f}" if size else ""
        print(f"{label:<50} {median:>8.1f} {ms_goal:>6} {cpu:>7.1f} {queries:>8} {kb:>8} {kb_goal:>6}")
    print("queries: constant in the number of cells (tests/portal/test_matrix*.py count them at 10 and 200 models)")

    # --- event ingest -----------------------------------------------------------------------------------
    hardware = HardwareFactory()
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    job = JobFactory(hardware=hardware)
    ts = datetime.now(UTC).isoformat()

    def batch(start: int, n: int) -> list[dict]:
        return [{"seq": s, "ts": ts, "stage": "load", "kind": "progress", "level": "info",
                 "message": f"tensor {s} loaded", "data": {"done": s, "total": args.events}}
                for s in range(start, start + n)]

    headers = {"HTTP_AUTHORIZATION": f"Token {token.secret}"}
    import json

    bodies = [json.dumps(batch(s, args.batch)) for s in range(1, args.events + 1, args.batch)]
    t0, c0 = time.perf_counter(), time.process_time()
    for body in bodies:
        r = client.post(f"/api/v1/jobs/{job.pk}/events/", body, content_type="application/json", **headers)
        assert r.status_code == 200, r.content
    ours, ours_cpu = time.perf_counter() - t0, time.process_time() - c0
    assert r.json()["acked"] == args.events
    # idempotent replay of the last batch
    t1 = time.perf_counter()
    client.post(f"/api/v1/jobs/{job.pk}/events/", bodies[-1], content_type="application/json", **headers)
    replay = time.perf_counter() - t1

    peer_job = JobFactory(hardware=hardware)
    peer_n = min(args.events, 5000)
    t0 = time.perf_counter()
    for start in range(1, peer_n + 1, args.batch):
        with transaction.atomic():
            for e in batch(start, min(args.batch, peer_n - start + 1)):
                JobEvent.objects.get_or_create(job=peer_job, seq=e["seq"], defaults={
                    "ts": datetime.fromisoformat(e["ts"]), "stage": e["stage"], "kind": e["kind"],
                    "level": e["level"], "message": e["message"], "data": e["data"]})
    peer = time.perf_counter() - t0
    title = f"event ingest (batches of {args.batch})"
    print(f"\n{title:<36} {'events':>10} {'seconds':>9} {'events/s':>10}")
    print(f"{'ours: POST .../events/ (HTTP stack)':<36} {args.events:>10} {ours:>9.2f} {args.events / ours:>10.0f}")
    print(f"{'  same, per CPU second of the portal':<36} {args.events:>10} {ours_cpu:>9.2f} "
          f"{args.events / ours_cpu:>10.0f}")
    print(f"{'ours: replay of one batch (dupes)':<36} {args.batch:>10} {replay:>9.3f} {args.batch / replay:>10.0f}")
    print(f"{'peer: get_or_create per event (ORM)':<36} {peer_n:>10} {peer:>9.2f} {peer_n / peer:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
