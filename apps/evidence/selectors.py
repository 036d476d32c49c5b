"""Read-side queries of evidence: the newest result of each stage in a cell, and benchmark history."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, Q, QuerySet, Subquery

from apps.evidence.models import (
    AlignmentReport,
    BenchmarkPoint,
    BenchmarkRun,
    StageResult,
)
from apps.jobs.choices import JobPurpose
from contract.tiers import STAGE_ORDER


def cell_results(model_id: int, hardware_id: int) -> QuerySet[StageResult]:
    """The results that are evidence of a cell: its certify jobs' (a reference run on the reference hardware
    holds the release's references, not evidence of that hardware's cell)."""
    return StageResult.objects.filter(job__model_id=model_id, job__hardware_id=hardware_id,
                                      job__purpose=JobPurpose.CERTIFY)


def newest_results(model_id: int, hardware_id: int, jobs_q: Q | None = None) -> dict[str, StageResult]:
    """stage -> the newest result of that stage in the cell (of the jobs ``jobs_q`` keeps, a query on results:
    one engine's), with its one-to-one evidence row (one query).

    One uncorrelated "newest id" subquery per stage: each sorts only that stage's results, so a year of daily
    benchmark runs costs a sort of the bench results, not reading the cell's whole history."""
    # every job of the cell, a reference run's too (the page shows its summary, labelled; the tier reads
    # ``cell_results`` only)
    evidence = StageResult.objects.filter(job__model_id=model_id, job__hardware_id=hardware_id)
    if jobs_q is not None:
        evidence = evidence.filter(jobs_q)
    newest = Q()
    for stage in STAGE_ORDER:
        newest |= Q(id=Subquery(evidence.filter(stage=stage).order_by("-created_at", "-id").values("id")[:1]))
    rows = (StageResult.objects.filter(newest)
            .select_related("plan", "load", "alignment", "serve", "benchmark", "env")
            .defer("section"))
    return {r.stage: r for r in rows}


def benchmark_runs(model_id: int, hardware_id: int, *, limit: int = 20) -> QuerySet[BenchmarkRun]:
    """The newest benchmark runs of a cell with their concurrency points (two queries)."""
    return (
        BenchmarkRun.objects.filter(model_id=model_id, hardware_id=hardware_id)
        .select_related("result")
        .prefetch_related(Prefetch("points", queryset=BenchmarkPoint.objects.order_by("concurrency")))
        .order_by("-created_at", "-id")[:limit]
    )


def alignment_detail(result_id: int) -> AlignmentReport | None:
    return (
        AlignmentReport.objects.filter(result_id=result_id)
        .prefetch_related("ops", "layers", "divergences")
        .first()
    )


def cell_evidence(model_id: int, hardware_id: int, jobs_q: Q | None = None) -> dict[str, Any]:
    """The evidence of a cell as plain data: the newest section of each stage (as stored), the operator
    checklist, alignment rows and the benchmark history."""
    newest = newest_results(model_id, hardware_id, jobs_q)
    sections = dict(StageResult.objects.filter(pk__in=[r.pk for r in newest.values()]).values_list("stage", "section"))
    out: dict[str, Any] = {
        "stages": {stage: {"job": r.job_id, "passed": r.passed, "verdict": r.verdict, "reasons": r.reasons,
                           "notes": r.verdict_notes,
                           "claimed_passed": r.claimed_passed, "disputed": r.disputed,
                           "defaults_version": r.defaults_version, "custom_thresholds": r.custom_thresholds,
                           "synthetic": r.synthetic, "at": r.created_at.isoformat(),
                           "scores": r.challenge_scores,  # align / eval: the portal's own scores of raw outputs
                           "section": sections.get(stage)} for stage, r in newest.items()},
    }
    inventory = newest.get("inventory")
    out["operators"] = (
        list(inventory.operators.order_by("status", "op").values("op", "count", "dtypes", "status", "decomposes_to"))
        if inventory else []
    )
    align = newest.get("align")
    report = alignment_detail(align.pk) if align else None
    out["alignment"] = None if report is None else {
        "passed": report.passed, "token_match_rate": report.token_match_rate, "kv_passed": report.kv_passed,
        "ops": [{"op": o.op, "cosine": o.cosine, "max_rel_err": o.max_rel_err, "max_abs_err": o.max_abs_err,
                 "passed": o.passed} for o in report.ops.all()],
        "layers": [{"layer": la.layer, "cosine": la.cosine, "max_rel_err": la.max_rel_err, "passed": la.passed}
                   for la in sorted(report.layers.all(), key=lambda x: x.layer)],
        "divergences": [{"prompt": d.prompt, "position": d.position, "ref_token": d.ref_token,
                         "target_token": d.target_token, "ref_top5": d.ref_top5, "target_top5": d.target_top5,
                         "near_tie": d.near_tie} for d in report.divergences.all()],
    }
    point_fields = [f.name for f in BenchmarkPoint._meta.fields if f.name not in ("id", "run")]
    out["benchmarks"] = [
        {"job": run.result.job_id, "at": run.created_at.isoformat(), "synthetic": run.result.synthetic,
         "verdict": run.result.verdict,
         "points": [{name: getattr(pt, name) for name in point_fields} for pt in run.points.all()]}
        for run in benchmark_runs(model_id, hardware_id)
    ]
    return out
