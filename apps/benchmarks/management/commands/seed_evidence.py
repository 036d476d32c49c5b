"""``manage.py seed_evidence``: adaptation jobs, Day-0 lead times and a year of daily benchmark runs with a
planted regression, for development and demos (run ``manage.py seed`` first for the catalog)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from apps.benchmarks.seeding import delete_seeded_jobs, seed_evidence
from apps.catalog.models import Hardware, ModelRelease
from apps.jobs.models import Job


class Command(BaseCommand):
    help = "Seed evidence: jobs per release and hardware, and daily benchmark history with a planted regression."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--days", type=int, default=365, help="days of daily benchmark runs (default 365)")
        parser.add_argument("--history-cells", type=int, default=2, help="cells with a benchmark history")
        parser.add_argument("--hardware-per-model", type=int, default=5)
        parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same evidence)")
        parser.add_argument("--reset", action="store_true", help="delete earlier seeded jobs first")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["days"] < 0 or options["history_cells"] < 0 or options["hardware_per_model"] < 1:
            raise CommandError("--days and --history-cells must be ≥ 0 and --hardware-per-model ≥ 1")
        if not ModelRelease.objects.exists() or not Hardware.objects.exists():
            raise CommandError("the catalog is empty: run `manage.py seed` first")
        if options["reset"]:
            self.stdout.write(f"deleted {delete_seeded_jobs()} rows of earlier seeded jobs")
        elif Job.objects.filter(spec__seeded=True).exists():
            raise CommandError("evidence was seeded already: use --reset to seed again")
        summary = seed_evidence(days=options["days"], history_cells=options["history_cells"],
                                hardware_per_model=options["hardware_per_model"], seed=options["seed"],
                                now=timezone.now())
        self.stdout.write(f"jobs: {summary.jobs}; cells: {len(summary.cells)} (all marked synthetic)")
        for model, hardware, runs in summary.history:
            self.stdout.write(f"history: {model} × {hardware}: {runs} daily runs")
        if summary.regression:
            r = summary.regression
            self.stdout.write(f"planted regression: {r.model} × {r.hardware} at {r.at:%Y-%m-%d %H:%M} "
                              f"(latency ×{r.latency_factor}, throughput ×{r.throughput_factor})")
