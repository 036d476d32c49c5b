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


def reference_declares_tools(model_id: int) -> bool | None:
    """Whether the release's chat template declares tools, as its reference run (on reference hardware, the
    portal's own) found it in a reference, serve or conformance section; None when no reference run said.
    A vendor's sections cannot then drop the conformance that tier 3 needs."""
    found = (StageResult.objects.filter(job__model_id=model_id, job__purpose=JobPurpose.REFERENCE,
                                        job__hardware__reference=True,
                                        stage__in=("reference", "serve", "conformance"))
             .exclude(section__template_declares_tools=None)
             .order_by("-created_at", "-id").values_list("section__template_declares_tools", flat=True).first())
    return found if isinstance(found, bool) else None
