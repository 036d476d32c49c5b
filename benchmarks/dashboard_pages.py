"""Dashboard speed: the cell page and the trends page of a cell with a year of daily benchmark runs (every run
with 4 concurrency levels and all latency, throughput and memory metrics), and the benchmark API reading 10
metrics of that year with regression detection; each beside a peer. Target: under 150 ms of server time, with
query counts that do not grow with the history.

Runs on PostgreSQL in a throwaway database (``test_<name>_dashbench``), created and dropped here:

    DAY0_DATABASE_URL=postgres://postgres@127.0.0.1:5432/day0 .venv/bin/python benchmarks/dashboard_pages.py
    ... --days 90      (a shorter history)

The history is written through the portal's services (jobs, result ingest, cell recomputation) under a
simulated clock (apps/benchmarks/seeding.py). Server time is measured in-process through Django's test client
(middleware, auth, view, template, JSON; no network); query counts come from ``CaptureQueriesContext``.
Peers: the cell's REST evidence (``/api/v1/cells/<model>/<hw>/``, ``apps.evidence.selectors.cell_evidence``,
which reads the whole history), and a per-run loop (one query per run for its points) feeding the same regression rule."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _throwaway_db import use_throwaway_database  # noqa: E402  (benchmarks/ is the script's folder)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")
TEN_METRICS = ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "itl_ms_p50", "itl_ms_p99",
               "e2e_ms_p50", "e2e_ms_p99", "output_tok_s", "peak_memory_bytes")


def _timed(fn, repeat: int) -> tuple[float, float]:  # noqa: ANN001
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), min(times)


def _peer_trends(model_id: int, hardware_id: int) -> int:
    """The peer: the runs, then one query per run for its points, then the same regression rule."""
    from apps.benchmarks.regressions import Point, detect_regressions
    from apps.evidence.models import BenchmarkRun

    series: dict[tuple[int, str], list] = {}
    for run in BenchmarkRun.objects.filter(model_id=model_id, hardware_id=hardware_id).order_by("created_at"):
        for p in run.points.all():
            for metric in TEN_METRICS:
                value = getattr(p, metric)
                if value is not None:
                    series.setdefault((p.concurrency, metric), []).append(Point(run.created_at, float(value)))
    return sum(len(detect_regressions(points, metric=m)) for (_, m), points in series.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365, help="daily benchmark runs of the cell (default 365)")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    if not use_throwaway_database("dashbench"):
        return 2
    from apps.benchmarks.seeding import run_adaptation, run_benchmark_history, simulated_clock
    from apps.evidence.models import BenchmarkPoint, BenchmarkRun
    from tests.factories import HardwareFactory, ModelReleaseFactory

    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(days=args.days)
    model = ModelReleaseFactory(slug="bench-model-8b", released_at=start - timedelta(days=2))
    hardware = HardwareFactory(slug="bench-accel")
    rng = random.Random(0)
    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO OFF")
    with simulated_clock(start - timedelta(days=1)) as clock:
        run_adaptation(model, hardware, "validated", clock, rng)
        run_benchmark_history(model, hardware, clock, rng, start=start, days=args.days,
                              regression_day=args.days - 10)
    runs = BenchmarkRun.objects.filter(model=model, hardware=hardware).count()
    points = BenchmarkPoint.objects.filter(run__model=model).count()
    print(f"data: 1 cell, {runs} benchmark runs over {args.days} days, {points} concurrency rows, "
          f"{len(TEN_METRICS)} metrics charted by the API (built in {time.perf_counter() - t0:.1f} s)\n")

    client = Client()
    cell = f"/cells/{model.slug}/{hardware.slug}/"
    requests = [
        ("cell page      GET /cells/<model>/<hw>/", cell),
        ("trends page    GET /trends/ (5 charts)", f"/trends/?model={model.slug}&hardware={hardware.slug}"),
        ("series API     10 metrics", f"/api/v1/benchmarks/?model={model.slug}&hardware={hardware.slug}"
                                      f"&metric={','.join(TEN_METRICS)}"),
        ("regressions    10 metrics", f"/api/v1/benchmarks/regressions/?model={model.slug}"
                                      f"&metric={','.join(TEN_METRICS)}"),
    ]
    rows = []
    for label, url in requests:
        client.get(url)  # warm
        reset_queries()
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        queries = len(ctx.captured_queries)
        median, best = _timed(lambda u=url: client.get(u), args.repeat)
        rows.append((label, median, best, queries, len(response.content)))

    def plain_cell_page() -> None:
        assert client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/").status_code == 200

    plain_cell_page()
    reset_queries()
    with CaptureQueriesContext(connection) as ctx:
        plain_cell_page()
    queries = len(ctx.captured_queries)
    median, best = _timed(plain_cell_page, args.repeat)
    rows.append(("peer: cell evidence API", median, best, queries, 0))
    reset_queries()
    with CaptureQueriesContext(connection) as ctx:
        flagged = _peer_trends(model.pk, hardware.pk)
    queries = len(ctx.captured_queries)
    median, best = _timed(lambda: _peer_trends(model.pk, hardware.pk), max(1, args.repeat // 2))
    rows.append((f"peer: query per run ({flagged} flags)", median, best, queries, 0))

    print(f"{'request':<44} {'median ms':>10} {'best ms':>9} {'queries':>8} {'bytes':>10}  target")
    for label, median, best, queries, size in rows:
        target = "" if label.startswith("peer") else ("< 150 ms ok" if median < 150 else "< 150 ms MISSED")
        print(f"{label:<44} {median:>10.1f} {best:>9.1f} {queries:>8} {size or '':>10}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
