"""What the portal hands an agent from its references, read at dispatch: a certify attempt's challenge (inputs
only), and the whole pool for a reference job on reference hardware. Reference outputs and answers are never
part of either."""

from __future__ import annotations

from typing import Any

from agents.pipeline import challenge_pool as cp
from apps.jobs.choices import JobPurpose
from apps.jobs.models import Job
from apps.references.models import Challenge, ReferenceRun


def payload_for(job: Job) -> dict[str, Any]:
    """The payload keys of ``job``: ``challenge`` for a certify attempt that has one, ``reference_pool`` for a
    reference job on reference hardware (only there), nothing otherwise."""
    if job.purpose == JobPurpose.REFERENCE:
        run = ReferenceRun.objects.filter(job_id=job.pk).first()
        if run is None or not job.hardware.reference:
            return {}
        return {"reference_pool": cp.reference_pool(cp.pool(), run.needles)}
    challenge = Challenge.objects.filter(job_id=job.pk, attempt=job.attempts).values_list("items", flat=True).first()
    return {"challenge": challenge} if challenge else {}
