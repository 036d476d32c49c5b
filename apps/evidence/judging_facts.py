"""The facts of a job the verdicts check against beyond its release and hardware (the layout it ran, what it
asked the bench for, its operators) and whether it is the release's reference run; read by ``judging``."""

from __future__ import annotations

from typing import Any

from apps.evidence.models import StageResult
from apps.jobs.choices import JobPurpose
from apps.jobs.models import Job


def physics_facts(job: Job, sections: dict[str, Any]) -> dict[str, Any]:
    """What the bench and align rules check against: the layout the job ran (its pinned degrees, else its plan
    evidence), what it asked the bench to run (``spec.bench``) and the operators of its inventory section."""
    def section(stage: str) -> dict[str, Any]:
        own = sections.get(stage)
        if isinstance(own, dict):
            return own
        stored = StageResult.objects.filter(job=job, stage=stage).values_list("section", flat=True).first()
        return stored if isinstance(stored, dict) else {}

    plan = section("plan").get("plan")
    plan = plan if isinstance(plan, dict) else {}
    layout = {k: job.spec.get(k) or plan.get(k) for k in ("tp", "pp", "ep")}
    inventory = section("inventory").get("ops")
    ops = [str(r["op"]) for r in inventory if isinstance(r, dict) and r.get("op")] if isinstance(inventory, list) \
        else None
    bench = job.spec.get("bench")
    return {"layout": layout, "bench_asked": bench if isinstance(bench, dict) else None, "inventory_ops": ops}


def is_reference_job(job: Job) -> bool:
    """The release's reference run: its load may give the release its manifest and its weight samples."""
    return job.purpose == JobPurpose.REFERENCE and bool(job.hardware.reference)
