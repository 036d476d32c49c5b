"""Re-judging stored verdicts: when the facts a verdict was judged with change (the hardware's spec, the model's
config or manifest) or the versioned defaults move (``contract.thresholds.DEFAULTS_VERSION``), every
affected stage result is judged again from its stored section with the same rules as at ingest, its cell's tier
is recomputed and the cell's history records why."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from apps.core import events
from apps.evidence.judging import judging_context
from apps.evidence.models import StageResult
from apps.jobs.choices import JobPurpose
from apps.references.services import challenge_judge
from contract import verdicts
from contract.thresholds import DEFAULTS_VERSION

# the facts ``judging.judging_context`` reads: a change of any of them re-judges
HARDWARE_JUDGED_FIELDS: tuple[str, ...] = ("memory_bytes", "devices_per_node", "intra_node_gbps", "inter_node_gbps",
                                           "memory_bandwidth_gbps", "shared_memory", "dtypes", "peak_tflops",
                                           "operator_manifest")
MODEL_JUDGED_FIELDS: tuple[str, ...] = ("config", "manifest", "manifest_source", "tensor_count", "has_chat_template",
                                        "modalities")
VERDICT_FIELDS = ("verdict", "passed", "reasons", "verdict_notes", "defaults_version", "custom_thresholds", "judged_at",
                  "challenge_scores")
CHALLENGED_STAGES = ("align", "eval")  # judged from the portal's scores of the attempt's raw outputs


@transaction.atomic
def rejudge_results(*, model: Any = None, hardware: Any = None, reason: str,
                    results: QuerySet[StageResult] | None = None) -> dict[str, Any]:
    """Judges again every stored result of ``model``'s and/or ``hardware``'s jobs (or the given ``results``)
    with the current rules, facts and defaults; recomputes each affected cell, whose history gets an entry with
    ``reason`` and the verdicts that changed (none when nothing changed). Returns
    ``{"results": n, "changed": m, "cells": k}``."""
    rows = results if results is not None else StageResult.objects.all()
    if model is not None:
        rows = rows.filter(job__model=model)
    if hardware is not None:
        rows = rows.filter(job__hardware=hardware)
    now = timezone.now()
    changes: dict[tuple[int, int], dict[str, list[str]]] = {}  # cell -> stage -> [before, after]
    # one job at a time (its load section decides the runtime path): its context, and one challenge judge per
    # attempt its align and eval were posted under
    job_id, context, judges = None, None, {}
    count = changed = 0
    batch: list[StageResult] = []
    for result in rows.select_related("job__model", "job__hardware").order_by("job_id", "id").iterator(chunk_size=500):
        job = result.job
        if job.pk != job_id:
            job_id, context, judges = job.pk, judging_context(job), {}
        judged_with = context
        if result.stage in CHALLENGED_STAGES and context.challenge is not None:  # the attempt it was posted under
            if result.attempt not in judges:
                judges[result.attempt] = challenge_judge(job, attempt=result.attempt)
            judged_with = dataclasses.replace(context, challenge=judges[result.attempt])
        verdict = verdicts.judge(result.stage, result.section, (job.spec or {}).get("thresholds") or {}, judged_with)
        if result.stage in CHALLENGED_STAGES:
            result.challenge_scores = (judged_with.challenge.scores.get(result.stage) if judged_with.challenge
                                       else None)
        count += 1
        key = (job.model_id, job.hardware_id)
        moved = changes.setdefault(key, {})  # the cell is recomputed even when none of its verdicts changed
        if (verdict.status, list(verdict.reasons)) != (result.verdict, list(result.reasons or [])):
            changed += 1
            moved[result.stage] = [result.verdict, verdict.status]
        result.verdict, result.passed = verdict.status, verdict.passed
        result.reasons, result.verdict_notes = verdict.reasons, verdict.notes
        result.defaults_version, result.custom_thresholds = verdict.defaults_version, verdict.custom_thresholds
        result.judged_at = now
        batch.append(result)
        if len(batch) >= 500:
            StageResult.objects.bulk_update(batch, VERDICT_FIELDS)
            batch = []
    if batch:
        StageResult.objects.bulk_update(batch, VERDICT_FIELDS)
    for (model_id, hardware_id), stages in changes.items():
        history = {"kind": "rejudge", "data": {"reason": reason, "verdicts": stages}} if stages else None
        what = "; ".join(f"{stage} {before} → {after}" for stage, (before, after) in sorted(stages.items()))
        events.send_now(events.cell_inputs_changed, model_id=model_id, hardware_id=hardware_id,
                        reason=f"re-judged: {reason}" + (f" ({what})" if what else ""), history=history)
    return {"results": count, "changed": changed, "cells": len(changes)}


def rejudge_release(release_id: int) -> int:
    """Judges again every stored align and eval result of the release's certify jobs (its reference arrived: the
    ``reference_recorded`` event), each against the challenge of the attempt it was posted under, and recomputes
    their cells; returns how many results were judged."""
    results = StageResult.objects.filter(job__model_id=release_id, job__purpose=JobPurpose.CERTIFY,
                                         stage__in=CHALLENGED_STAGES, synthetic=False)
    return rejudge_results(results=results, reason="the release's reference arrived")["results"]


def rejudge_outdated_defaults() -> list[dict[str, Any]]:
    """Re-judges the results judged under another defaults version than the current one, one pass per old
    version (the cells' history says "defaults OLD → NEW"). Returns one summary per version."""
    done = []
    olds = (StageResult.objects.exclude(defaults_version=DEFAULTS_VERSION).order_by()
            .values_list("defaults_version", flat=True).distinct())
    for old in sorted(set(olds)):
        summary = rejudge_results(results=StageResult.objects.filter(defaults_version=old),
                                  reason=f"defaults {old or 'unversioned'} → {DEFAULTS_VERSION}")
        done.append({"from": old, "to": DEFAULTS_VERSION, **summary})
    return done


def outdated_defaults_count() -> int:
    return StageResult.objects.exclude(defaults_version=DEFAULTS_VERSION).count()
