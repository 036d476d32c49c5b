"""Result ingest: an agent's stage sections, bound to the job's current attempt and nonce, stored as evidence
(``services.do_record_stage_results``) with the portal's verdicts; the cell follows (``cell_inputs_changed``)."""

from __future__ import annotations

import secrets
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.accounts.access import Actor
from apps.core import events
from apps.evidence.models import StageResult
from apps.evidence.services import do_record_stage_results, validate_stage_names
from apps.jobs.choices import ACTIVE_STATES
from apps.jobs.models import Job
from apps.jobs.services import InvalidTransition, check_agent_for_job
from contract.events import EVENT_MESSAGE_MAX, failed_stage_problem


def parse_result_document(doc: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Accepts ``{"stage": s, "section": {...}}`` or a whole stage report ``{"stages": {...}, "failed_stage",
    "error", ...}``. Returns (sections by stage, report-level fields)."""
    if not isinstance(doc, dict):
        raise ValidationError({"detail": "the result document must be a JSON object"})
    if "stage" in doc:
        stage = doc.get("stage")
        if not isinstance(stage, str):
            raise ValidationError({"stage": "must be a stage name"})
        if "section" not in doc:
            raise ValidationError({"section": "is required with 'stage'"})
        return {stage: doc["section"]}, {}
    if "stages" in doc:
        stages = doc["stages"]
        if not isinstance(stages, dict) or not stages:
            raise ValidationError({"stages": "must be a non-empty object of stage sections"})
        extra = {k: doc[k] for k in ("failed_stage", "error") if doc.get(k) is not None}
        for key, value in extra.items():
            if not isinstance(value, str):
                raise ValidationError({key: "must be a string or null"})
        if (problem := failed_stage_problem(extra.get("failed_stage", ""))) is not None:
            raise ValidationError({"failed_stage": problem})
        if len(extra.get("error", "")) > EVENT_MESSAGE_MAX:
            raise ValidationError({"error": f"is {len(extra['error'])} characters long; a job's error is at most "
                                            f"{EVENT_MESSAGE_MAX}"})
        return dict(stages), extra
    raise ValidationError({"detail": "expected {'stage', 'section'} or a stage report with 'stages'"})


def parse_result_binding(doc: Any) -> tuple[int, str]:
    """The (attempt, nonce) a result document is bound to: the task payload's ``attempt`` and ``nonce``, posted
    beside the section. A missing or malformed one is a 400 naming the field."""
    if not isinstance(doc, dict):
        raise ValidationError({"detail": "the result document must be a JSON object"})
    attempt, nonce = doc.get("attempt"), doc.get("nonce")
    if attempt is None:
        raise ValidationError({"attempt": "is required: the attempt the section was produced under (the task's "
                                          "'attempt')"})
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= 1_000_000:
        raise ValidationError({"attempt": f"must be an integer from 1 to 1000000, got {str(attempt)[:40]!r}"})
    if nonce is None or nonce == "":
        raise ValidationError({"nonce": "is required: the nonce of the attempt the section was produced under "
                                        "(the task's 'nonce')"})
    if not isinstance(nonce, str) or len(nonce) > 64:
        raise ValidationError({"nonce": "must be a string of at most 64 characters"})
    return attempt, nonce


def _check_binding(locked: Job, attempt: int, nonce: str, stages: list[str]) -> None:
    """A section belongs to the job's current attempt, carries that attempt's nonce, and is the first of its
    stage in that attempt; anything else (a superseded attempt, a wrong nonce, a replay) is a 409 naming it."""
    if attempt != locked.attempts:
        raise InvalidTransition(f"the result is for attempt {attempt}, job {locked.pk} is at attempt "
                                f"{locked.attempts}: a superseded attempt's section is not taken")
    if not locked.nonce or not secrets.compare_digest(nonce.encode(), locked.nonce.encode()):
        raise InvalidTransition(f"the nonce does not match job {locked.pk}'s attempt {locked.attempts}")
    stored = sorted(StageResult.objects.filter(job=locked, attempt=attempt, stage__in=stages)
                    .values_list("stage", flat=True))
    if stored:
        raise InvalidTransition(f"job {locked.pk} attempt {attempt} already has a result for "
                                f"{', '.join(stored)}: a stage is posted once per attempt (a replay is refused)")


def check_record_job_results(actor: Actor, job: Job, doc: Any) -> list:
    """An agent posts results of the job it claimed (``check_agent_for_job``, checked again on the locked row)
    bound to its current attempt and nonce (``do_record_job_results``)."""
    check_agent_for_job(actor, job, reporting=True)
    return do_record_job_results(job, doc, actor=actor)


@transaction.atomic
def do_record_job_results(job: Job, doc: Any, *, actor: Actor | None = None) -> list:
    """Stores a stage section or a whole report of ``job`` as evidence and recomputes its cell. The document
    carries ``attempt`` and ``nonce`` (400 naming a missing one); the job row is locked before they are compared
    with its current attempt and nonce (409 for a superseded attempt, a wrong nonce or a stage already stored in
    this attempt)."""

    sections, extra = parse_result_document(doc)
    attempt, nonce = parse_result_binding(doc)
    claimed = doc.get("hardware") if isinstance(doc, dict) and "stages" in doc else None
    if claimed is not None and claimed != job.hardware.slug:
        raise ValidationError({"hardware": f"the report is for {claimed!r}, job {job.pk} runs on {job.hardware.slug!r}"})
    validate_stage_names(job, list(sections))
    if (problem := failed_stage_problem(extra.get("failed_stage", ""), job.stages)) is not None:
        raise ValidationError({"failed_stage": problem})
    locked = Job.objects.select_for_update().get(pk=job.pk)
    if actor is not None:
        check_agent_for_job(actor, locked, reporting=True)
    if locked.state not in ACTIVE_STATES:
        raise InvalidTransition(f"job {job.pk} is {locked.state}; results are taken only while it is active")
    _check_binding(locked, attempt, nonce, list(sections))
    results = do_record_stage_results(locked, sections)
    StageResult.objects.filter(pk__in=[r.pk for r in results]).update(attempt=attempt)
    for result in results:
        result.attempt = attempt
    if extra:
        Job.objects.filter(pk=job.pk).update(failed_stage=extra.get("failed_stage") or "",
                                             error=extra.get("error") or "")
    events.send_now(events.cell_inputs_changed, model_id=job.model_id, hardware_id=job.hardware_id, history=None,
                    reason=f"results of job {job.pk} attempt {attempt}: {', '.join(sorted(sections))}")
    return results
