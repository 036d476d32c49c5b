"""The ``reference`` stage's section (docs/references.md): validated before anything is written, posted only by
a reference job on reference hardware (403 otherwise), bound to its run's pool version and the attempt's nonce,
answering every pool item and every needle of its run exactly once. Storing it finishes the run and judges the
release's stored align and eval results again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from apps.core import events
from apps.core import parsing as p
from apps.jobs.choices import JobPurpose
from apps.references.models import ReferenceRun, ReferenceState
from contract.challenges import pool as cp
from contract.challenges import scoring as cs

# what the portal keeps of each answer (anything else in an item is dropped)
KEPT: dict[str, tuple[str, ...]] = {"e2e": ("tokens", "top_logprobs", "prompt_tokens"),
                                    "mc": ("loglikelihoods", "greedy"), "qa": ("text",),
                                    "ppl": ("loglikelihood", "tokens"), "needle": ("text",),
                                    "code": ("completion", "sha256", "passed", "status"), "agent": ("actions",)}
MAX_ITEMS = 10_000  # answers of one kind


def check_may_post_reference(job: Any) -> None:
    """Only a reference job running on reference hardware posts a reference (403 naming the rule)."""
    if job.purpose != JobPurpose.REFERENCE or not job.hardware.reference:
        raise PermissionDenied(f"job {job.pk} may not post a reference: only a reference job on hardware marked "
                               f"reference does (this is a {job.purpose} job on {job.hardware.slug})")


def parse_reference(s: dict[str, Any], path: str) -> Callable[[Any], None]:
    """Types and bounds of a reference section (a 400 naming the path); the saver binds it to its run."""
    pool_version = p.text(s, "pool_version", path, max_length=64, required=True)
    nonce = p.text(s, "nonce", path, max_length=64, required=True)
    top_k = p.integer(s, "top_k", path, low=1, high=100) or cp.TOP_K
    answers = {kind: p.arr(s.get(kind), f"{path}.{kind}", max_items=MAX_ITEMS) for kind in KEPT}

    def save(result: Any) -> None:
        job = result.job
        check_may_post_reference(job)
        run = ReferenceRun.objects.select_for_update().filter(job_id=job.pk).first()
        if run is None:
            raise PermissionDenied(f"job {job.pk} is no release's reference run")
        if nonce != job.nonce:
            raise p.fail(f"{path}.nonce", f"is not the nonce of job {job.pk}'s current attempt")
        if pool_version != run.pool_version:
            raise p.fail(f"{path}.pool_version", f"the run was queued for pool {run.pool_version}, not {pool_version}")
        pool = cp.pool()
        if pool.version != run.pool_version:
            raise p.fail(f"{path}.pool_version", f"the portal's pool is now {pool.version}: queue a new reference run")
        outputs: dict[str, Any] = {}
        problems: list[str] = []
        for kind in KEPT:
            drawn = pool.agent_items(kind) if kind != "needle" else list(run.needles)
            by_id, found = cs.check_raw(kind, answers[kind], drawn, top_k)
            problems += found
            outputs[kind] = {item_id: {key: raw.get(key) for key in KEPT[kind] if key in raw}
                             for item_id, raw in by_id.items()}
        if problems:
            raise ValidationError({path: problems[:10]})
        accuracy = cs.needle_by_length(run.needles, outputs.pop("needle"), cp.needle_answers(run.needles))
        outputs["needle_accuracy"] = {str(length): row for length, row in accuracy.items()}
        outputs["top_k"] = top_k
        run.outputs, run.state, run.finished_at, run.error = outputs, ReferenceState.FINISHED, timezone.now(), ""
        run.save(update_fields=["outputs", "state", "finished_at", "error"])
        # the outputs live on the run only: the stored section (served with the cell's evidence) is a summary
        summary = {"pool_version": pool_version, "reference_run": run.pk, "top_k": top_k,
                   "answered": {kind: len(answers[kind]) for kind in KEPT}}
        type(result).objects.filter(pk=result.pk).update(section=summary)
        result.section = summary
        events.send_now(events.reference_recorded, release_id=run.release_id)  # its challenged results: again

    return save
