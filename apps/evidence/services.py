"""Turns stage result documents into evidence rows. Validation happens before anything is written, so a bad
document stores nothing; posting a stage again for the same job replaces its rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from agents.pipeline.tiers import STAGE_ORDER, stage_passed
from apps.evidence import parsing as p
from apps.evidence.models import (
    LATENCY_METRICS,
    LATENCY_STATS,
    AlignmentLayer,
    AlignmentOp,
    AlignmentReport,
    BenchmarkPoint,
    BenchmarkRun,
    EnvLock,
    LoadProblem,
    LoadReport,
    OperatorCheck,
    PlanEvidence,
    ServeReport,
    ShardChecksum,
    StageResult,
    TokenDivergence,
)
from apps.jobs.models import Job

Saver = Callable[[StageResult], None]
OPERATOR_STATUSES = frozenset({"native", "decomposed", "fallback", "missing"})
# the key a section must have for the tier rule to judge it
REQUIRED_KEY: dict[str, str] = {"plan": "fits", "load": "ok", "serve": "text_path_ok", "align": "passed",
                                "bench": "runs", "eval": "passed"}


def _plan(s: dict[str, Any], path: str) -> Saver:
    plan = p.obj(s.get("plan"), f"{path}.plan", required=False)
    fields = dict(
        params_total=p.integer(s, "params_total", path), params_active=p.integer(s, "params_active", path),
        weight_bytes=p.integer(s, "weight_bytes", path), kv_bytes_per_token=p.integer(s, "kv_bytes_per_token", path),
        tp=p.integer(plan, "tp", f"{path}.plan"), pp=p.integer(plan, "pp", f"{path}.plan"),
        ep=p.integer(plan, "ep", f"{path}.plan"), devices=p.integer(plan, "devices", f"{path}.plan"),
        fits=bool(p.boolean(s, "fits", path, required=True)), bytes_per_device=p.integer(s, "bytes_per_device", path),
        max_context=p.integer(s, "max_context", path), max_batch=p.integer(s, "max_batch", path),
        dtype=p.text(s, "dtype", path, max_length=32),
    )
    return lambda result: PlanEvidence.objects.create(result=result, **fields) and None


def _load(s: dict[str, Any], path: str) -> Saver:
    fields = dict(
        ok=bool(p.boolean(s, "ok", path, required=True)), tensors=p.integer(s, "tensors", path),
        bytes=p.integer(s, "bytes", path), seconds=p.num(s, "seconds", path), gb_per_s=p.num(s, "gb_per_s", path),
        peak_rss_bytes=p.integer(s, "peak_rss_bytes", path),
    )
    shards = []
    for i, raw in enumerate(p.arr(s.get("shards"), f"{path}.shards")):
        row = p.obj(raw, f"{path}.shards[{i}]")
        shards.append(ShardChecksum(file=p.text(row, "file", f"{path}.shards[{i}]", required=True),
                                    sha256=p.text(row, "sha256", f"{path}.shards[{i}]", max_length=64)))
    problems = []
    for i, raw in enumerate(p.arr(s.get("problems"), f"{path}.problems")):
        row = p.obj(raw, f"{path}.problems[{i}]")
        problems.append(LoadProblem(tensor=p.text(row, "tensor", f"{path}.problems[{i}]"),
                                    problem=p.text(row, "problem", f"{path}.problems[{i}]", max_length=10_000)))

    def save(result: StageResult) -> None:
        load = LoadReport.objects.create(result=result, **fields)
        for row in (*shards, *problems):
            row.load = load
        ShardChecksum.objects.bulk_create(shards)
        LoadProblem.objects.bulk_create(problems)

    return save


def _inventory(s: dict[str, Any], path: str) -> Saver:
    rows = []
    for i, raw in enumerate(p.arr(s.get("ops"), f"{path}.ops")):
        at = f"{path}.ops[{i}]"
        row = p.obj(raw, at)
        status = p.text(row, "status", at, max_length=16, required=True)
        if status not in OPERATOR_STATUSES:
            raise p.fail(f"{at}.status", f"must be one of {sorted(OPERATOR_STATUSES)}, got {status!r}")
        rows.append(OperatorCheck(op=p.text(row, "op", at, max_length=200, required=True),
                                  count=p.integer(row, "count", at) or 0, dtypes=p.arr(row.get("dtypes"), f"{at}.dtypes"),
                                  status=status, decomposes_to=p.arr(row.get("decomposes_to"), f"{at}.decomposes_to")))

    def save(result: StageResult) -> None:
        for row in rows:
            row.result = result
        OperatorCheck.objects.bulk_create(rows)

    return save


def _align(s: dict[str, Any], path: str) -> Saver:
    e2e = p.obj(s.get("e2e"), f"{path}.e2e", required=False)
    kv = p.obj(s.get("kv_cache"), f"{path}.kv_cache", required=False)
    fields = dict(
        passed=bool(p.boolean(s, "passed", path, required=True)),
        thresholds=p.obj(s.get("thresholds"), f"{path}.thresholds", required=False),
        e2e_prompts=p.integer(e2e, "prompts", f"{path}.e2e"), e2e_tokens=p.integer(e2e, "tokens", f"{path}.e2e"),
        token_match_rate=p.num(e2e, "token_match_rate", f"{path}.e2e"),
        perplexity_ref=p.num(e2e, "perplexity_ref", f"{path}.e2e"),
        perplexity_target=p.num(e2e, "perplexity_target", f"{path}.e2e"),
        kv_passed=p.boolean(kv, "passed", f"{path}.kv_cache"), kv_max_abs_err=p.num(kv, "max_abs_err", f"{path}.kv_cache"),
        kv_lengths=p.arr(kv.get("lengths"), f"{path}.kv_cache.lengths"),
    )
    ops, layers, divergences = [], [], []
    for i, raw in enumerate(p.arr(s.get("ops"), f"{path}.ops")):
        at, row = f"{path}.ops[{i}]", p.obj(raw, f"{path}.ops[{i}]")
        ops.append(AlignmentOp(op=p.text(row, "op", at, max_length=200, required=True), cosine=p.num(row, "cosine", at),
                               max_rel_err=p.num(row, "max_rel_err", at), max_abs_err=p.num(row, "max_abs_err", at),
                               passed=bool(p.boolean(row, "passed", at, required=True))))
    for i, raw in enumerate(p.arr(s.get("layers"), f"{path}.layers")):
        at, row = f"{path}.layers[{i}]", p.obj(raw, f"{path}.layers[{i}]")
        layers.append(AlignmentLayer(layer=p.integer(row, "layer", at, required=True), cosine=p.num(row, "cosine", at),
                                     max_rel_err=p.num(row, "max_rel_err", at),
                                     passed=bool(p.boolean(row, "passed", at, required=True))))
    for i, raw in enumerate(p.arr(e2e.get("divergences"), f"{path}.e2e.divergences")):
        at, row = f"{path}.e2e.divergences[{i}]", p.obj(raw, f"{path}.e2e.divergences[{i}]")
        divergences.append(TokenDivergence(
            prompt=p.integer(row, "prompt", at, required=True), position=p.integer(row, "position", at, required=True),
            ref_token=p.integer(row, "ref_token", at), target_token=p.integer(row, "target_token", at),
            ref_top5=p.arr(row.get("ref_top5"), f"{at}.ref_top5"),
            target_top5=p.arr(row.get("target_top5"), f"{at}.target_top5"),
            near_tie=bool(p.boolean(row, "near_tie", at)),
        ))

    def save(result: StageResult) -> None:
        report = AlignmentReport.objects.create(result=result, **fields)
        for row in (*ops, *layers, *divergences):
            row.report = report
        AlignmentOp.objects.bulk_create(ops)
        AlignmentLayer.objects.bulk_create(layers)
        TokenDivergence.objects.bulk_create(divergences)

    return save


def _serve(s: dict[str, Any], path: str) -> Saver:
    fields = dict(ready_seconds=p.num(s, "ready_seconds", path), endpoint=p.text(s, "endpoint", path),
                  text_path_ok=bool(p.boolean(s, "text_path_ok", path, required=True)))
    return lambda result: ServeReport.objects.create(result=result, **fields) and None


def _bench(s: dict[str, Any], path: str) -> Saver:
    points = []
    runs = s.get("runs")
    if not isinstance(runs, list):
        raise p.fail(f"{path}.runs", "must be a list of concurrency levels")
    # the runtime's benchmark reports the server's peak once, for the whole sweep; a run may carry its own
    sweep_peak = p.integer(s, "peak_memory_bytes", path)
    for i, raw in enumerate(runs):
        at, row = f"{path}.runs[{i}]", p.obj(raw, f"{path}.runs[{i}]")
        values: dict[str, Any] = {}
        for metric in LATENCY_METRICS:
            stats = p.obj(row.get(metric), f"{at}.{metric}", required=False)
            for stat in LATENCY_STATS:
                values[f"{metric}_{stat}"] = p.num(stats, stat, f"{at}.{metric}")
        concurrency = p.integer(row, "concurrency", at, required=True)
        if concurrency < 1:
            raise p.fail(f"{at}.concurrency", "must be at least 1")
        points.append(BenchmarkPoint(concurrency=concurrency, output_tok_s=p.num(row, "output_tok_s", at),
                                     req_s=p.num(row, "req_s", at), failed=p.integer(row, "failed", at) or 0,
                                     peak_memory_bytes=p.integer(row, "peak_memory_bytes", at) or sweep_peak,
                                     **values))

    def save(result: StageResult) -> None:
        job = result.job
        run = BenchmarkRun.objects.create(result=result, model_id=job.model_id, hardware_id=job.hardware_id)
        for point in points:
            point.run = run
        BenchmarkPoint.objects.bulk_create(points)

    return save


def _env(s: dict[str, Any], path: str) -> Saver:
    fields = dict(runtime_commit=p.text(s, "runtime_commit", path, max_length=64), torch=p.text(s, "torch", path, max_length=64),
                  python=p.text(s, "python", path, max_length=64), device=p.text(s, "device", path, max_length=200),
                  device_count=p.integer(s, "device_count", path),
                  dispatch_key=p.text(s, "dispatch_key", path, max_length=64),
                  driver=p.text(s, "driver", path, max_length=200))
    return lambda result: EnvLock.objects.create(result=result, **fields) and None


def _eval(s: dict[str, Any], path: str) -> Saver:
    p.boolean(s, "passed", path, required=True)
    return lambda result: None  # the section itself (on StageResult) is the evidence


PARSERS: dict[str, Callable[[dict[str, Any], str], Saver]] = {
    "plan": _plan, "load": _load, "inventory": _inventory, "align": _align, "serve": _serve, "bench": _bench,
    "env": _env, "eval": _eval,
}
assert set(PARSERS) == set(STAGE_ORDER)


def parse_stage_section(stage: str, section: Any) -> Saver:
    """Validates one stage's section; returns what writes its rows. Raises ``ValidationError`` naming the path."""
    if stage not in PARSERS:
        raise p.fail("stage", f"unknown stage {stage!r}; stages are {', '.join(STAGE_ORDER)}")
    section = p.obj(section, f"stages.{stage}")
    return PARSERS[stage](section, f"stages.{stage}")


@transaction.atomic
def do_record_stage_results(job: Job, sections: dict[str, dict[str, Any]]) -> list[StageResult]:
    """Stores validated sections of ``job`` (replacing earlier results of the same stages) as evidence rows.
    Every section is validated before the first write."""
    savers = {stage: parse_stage_section(stage, section) for stage, section in sections.items()}
    StageResult.objects.filter(job=job, stage__in=list(sections)).delete()
    results = []
    for stage, section in sections.items():
        result = StageResult.objects.create(job=job, stage=stage, passed=bool(stage_passed(stage, section)),
                                            section=section)
        result.job = job
        savers[stage](result)
        results.append(result)
    return results


def validate_stage_names(job: Job, stages: list[str]) -> None:
    """Every stage must be one the job asked for."""
    requested = job.stages
    for stage in stages:
        if stage not in PARSERS:
            raise ValidationError({"stage": f"unknown stage {stage!r}; stages are {', '.join(STAGE_ORDER)}"})
        if requested and stage not in requested:
            raise ValidationError({"stage": f"stage {stage!r} was not requested by job {job.pk} "
                                            f"(its stages: {', '.join(requested)})"})
