"""``manage.py seed``: the bundled model and hardware catalog, the demo organization and its admin user; verdicts
stored under older defaults judged again, and the current pool's reference runs queued. Here, in the evidence
app, because it drives catalog, references and evidence, the highest of the three."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from apps.catalog.seed import ensure_demo_admin, seed_catalog
from apps.evidence.rejudge import rejudge_outdated_defaults
from apps.references.services import ensure_references


class Command(BaseCommand):
    help = "Load the bundled catalog (real model configs and accelerators) and a demo admin; idempotent."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--no-admin", action="store_true", help="do not create the demo admin user")
        parser.add_argument("--admin-user", default="admin")
        parser.add_argument("--admin-password", default=None, help="set this password (default: random, new users)")
        parser.add_argument("--no-cpu", action="store_true", help="do not add this host as hardware 'cpu'")

    def handle(self, *args: Any, **options: Any) -> None:
        summary = seed_catalog(include_cpu=not options["no_cpu"])
        self.stdout.write(f"catalog: {len(summary.created)} created, {len(summary.updated)} updated, "
                          f"{len(summary.unchanged)} unchanged")
        for done in rejudge_outdated_defaults():  # verdicts stored under an older defaults table
            self.stdout.write(f"re-judged {done['results']} results of defaults {done['from']} → {done['to']} "
                              f"({done['changed']} changed, {done['cells']} cells)")
        self.stdout.write(f"reference runs queued: {len(ensure_references())}")  # the current pool's (idempotent)
        if not options["no_admin"]:
            user, password = ensure_demo_admin(options["admin_user"], options["admin_password"])
            if password:
                self.stdout.write(f"admin user: {user.username} / {password}")
            else:
                self.stdout.write(f"admin user: {user.username} (exists; password unchanged)")
