"""``manage.py rejudge_results``: judge stored results again (those under an older defaults version by default;
``--model``/``--hardware`` every result of a model or hardware) and recompute their cells, with the reason in
each cell's history."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.catalog.models import Hardware, ModelRelease
from apps.evidence.rejudge import rejudge_outdated_defaults, rejudge_results


class Command(BaseCommand):
    help = "Re-judge stored stage results (older defaults version, or every result of a model / hardware)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--model", help="every result of this model's jobs")
        parser.add_argument("--hardware", help="every result of this hardware's jobs")
        parser.add_argument("--reason", default="", help="what the cells' history says (default: by hand)")

    def handle(self, *args: Any, **options: Any) -> None:
        model = hardware = None
        if options["model"]:
            model = ModelRelease.objects.filter(slug=options["model"]).first()
            if model is None:
                raise CommandError(f"no model with slug {options['model']!r}")
        if options["hardware"]:
            hardware = Hardware.objects.filter(slug=options["hardware"]).first()
            if hardware is None:
                raise CommandError(f"no hardware with slug {options['hardware']!r}")
        if model is None and hardware is None:
            for s in rejudge_outdated_defaults() or [{"from": None}]:
                if s["from"] is None:
                    self.stdout.write("every result is judged under the current defaults")
                else:
                    self.stdout.write(f"defaults {s['from']} → {s['to']}: {s['results']} results re-judged, "
                                      f"{s['changed']} changed, {s['cells']} cells")
            return
        what = " and ".join(f"{k} {v}" for k, v in (("model", options["model"]), ("hardware", options["hardware"])) if v)
        s = rejudge_results(model=model, hardware=hardware, reason=options["reason"] or f"{what} re-judged by hand")
        self.stdout.write(f"{s['results']} results re-judged, {s['changed']} changed, {s['cells']} cells")
