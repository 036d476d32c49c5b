"""``manage.py queue_references``: a reference run for every release with a ``reference_source`` that has no
queued or finished one for the current pool version (run it after the pool changes; ``seed`` runs it too)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from apps.references.services import ensure_references, reference_hardware
from contract.challenges import pool as cp


class Command(BaseCommand):
    help = "Queue reference runs for the current challenge pool version (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        if reference_hardware() is None:
            self.stdout.write("no hardware is marked reference: nothing queued")
            return
        runs = ensure_references()
        self.stdout.write(f"pool {cp.pool().version[:12]}: {len(runs)} reference run(s) queued"
                          + "".join(f"\n  {r.release.slug}: job {r.job_id}" for r in runs))
