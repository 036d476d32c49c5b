"""Turns stage result documents into evidence rows, each with the portal's own verdict on it
(``contract.verdicts``) beside the agent's claimed flag. Validation (types and bounds) happens before
anything is written, so a bad document stores nothing; posting a stage again for the same job replaces its
rows. A section missing what its verdict needs is stored as *incomplete*, never passing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.core import events
from apps.core import parsing as p
from apps.evidence import manifests, weights
from apps.evidence.judging import judging_context
from apps.evidence.judging_facts import is_reference_job
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
from apps.evidence.tasks import queue_rerun
from apps.jobs.models import Job
from apps.references.sections import parse_reference
from contract import verdicts
from contract.conformance import ALL_CHECKS
from contract.manifest import sha256_problem, shard_name_problem
from contract.quant_cost import problems as quant_cost_problems
from contract.sections import type_problems
from contract.tiers import STAGE_ORDER
from contract.verdicts import conformance as conformance_verdict

Saver = Callable[[StageResult], None]
OPERATOR_STATUSES = frozenset({"native", "decomposed", "fallback", "missing"})
# Bounds on what one result stores: more is a 400 naming the field and the bound, storing nothing.
MAX_BENCH_RUNS = 64
MAX_CONCURRENCY = 4096
MAX_DEVICES = 1 << 16  # a plan's tp, pp, ep and device count
MAX_LOAD_PROBLEMS = 1000
MAX_SHARDS = 10_000
MAX_INVENTORY_OPS = 5000
MAX_ALIGN_OPS = 2000
MAX_LAYERS = 1000
MAX_DIVERGENCES = 1000
MAX_KV_LENGTHS = 64
MAX_EVAL_TASKS = 256
MAX_NEEDLE_CELLS = 256

def _plan(s: dict[str, Any], path: str) -> Saver:
    plan = p.obj(s.get("plan"), f"{path}.plan", required=False)
    fields = dict(
        params_total=p.integer(s, "params_total", path), params_active=p.integer(s, "params_active", path),
        weight_bytes=p.integer(s, "weight_bytes", path), kv_bytes_per_token=p.integer(s, "kv_bytes_per_token", path),
        tp=p.integer(plan, "tp", f"{path}.plan", low=1, high=MAX_DEVICES),
        pp=p.integer(plan, "pp", f"{path}.plan", low=1, high=MAX_DEVICES),
        ep=p.integer(plan, "ep", f"{path}.plan", low=1, high=MAX_DEVICES),
        devices=p.integer(plan, "devices", f"{path}.plan", low=1, high=MAX_DEVICES),
        fits=bool(p.boolean(s, "fits", path)), bytes_per_device=p.integer(s, "bytes_per_device", path),
        max_context=p.integer(s, "max_context", path), max_batch=p.integer(s, "max_batch", path),
        dtype=p.text(s, "dtype", path, max_length=32),
    )
    return lambda result: PlanEvidence.objects.create(result=result, **fields) and None


def _load(s: dict[str, Any], path: str) -> Saver:
    fields = dict(
        ok=bool(p.boolean(s, "ok", path)), tensors=p.integer(s, "tensors", path),
        bytes=p.integer(s, "bytes", path), seconds=p.num(s, "seconds", path), gb_per_s=p.num(s, "gb_per_s", path),
        peak_rss_bytes=p.integer(s, "peak_rss_bytes", path),
    )
    shards, names = [], set()
    for i, raw in enumerate(p.arr(s.get("shards"), f"{path}.shards", max_items=MAX_SHARDS)):
        row = p.obj(raw, f"{path}.shards[{i}]")
        at = f"{path}.shards[{i}]"
        name, digest = p.text(row, "file", at, required=True), p.text(row, "sha256", at, max_length=64)
        if (problem := shard_name_problem(name)) is not None:  # as a manifest's names: staff may settle on them
            raise p.fail(f"{at}.file", problem)
        if digest and (problem := sha256_problem(digest)) is not None:
            raise p.fail(f"{at}.sha256", problem)
        if name in names:
            raise p.fail(f"{at}.file", f"{name!r} is listed twice")
        names.add(name)
        shards.append(ShardChecksum(file=name, sha256=digest))
    problems = []
    for i, raw in enumerate(p.arr(s.get("problems"), f"{path}.problems", max_items=MAX_LOAD_PROBLEMS)):
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
    for i, raw in enumerate(p.arr(s.get("ops"), f"{path}.ops", max_items=MAX_INVENTORY_OPS)):
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
    cost = p.obj(s.get("e2e_original"), f"{path}.e2e_original", required=False)  # kept in the section's JSON
    for at, message in quant_cost_problems(cost, f"{path}.e2e_original")[:1]:
        raise p.fail(at, message)
    fields = dict(
        passed=bool(p.boolean(s, "passed", path)),
        thresholds=p.obj(s.get("thresholds"), f"{path}.thresholds", required=False),
        e2e_prompts=p.integer(e2e, "prompts", f"{path}.e2e"), e2e_tokens=p.integer(e2e, "tokens", f"{path}.e2e"),
        token_match_rate=p.num(e2e, "token_match_rate", f"{path}.e2e"),
        perplexity_ref=p.num(e2e, "perplexity_ref", f"{path}.e2e"),
        perplexity_target=p.num(e2e, "perplexity_target", f"{path}.e2e"),
        kv_passed=p.boolean(kv, "passed", f"{path}.kv_cache"), kv_max_abs_err=p.num(kv, "max_abs_err", f"{path}.kv_cache"),
        kv_lengths=p.arr(kv.get("lengths"), f"{path}.kv_cache.lengths", max_items=MAX_KV_LENGTHS),
    )
    ops, layers, divergences = [], [], []
    for i, raw in enumerate(p.arr(s.get("ops"), f"{path}.ops", max_items=MAX_ALIGN_OPS)):
        at, row = f"{path}.ops[{i}]", p.obj(raw, f"{path}.ops[{i}]")
        ops.append(AlignmentOp(op=p.text(row, "op", at, max_length=200, required=True), cosine=p.num(row, "cosine", at),
                               max_rel_err=p.num(row, "max_rel_err", at), max_abs_err=p.num(row, "max_abs_err", at),
                               passed=bool(p.boolean(row, "passed", at))))
    for i, raw in enumerate(p.arr(s.get("layers"), f"{path}.layers", max_items=MAX_LAYERS)):
        at, row = f"{path}.layers[{i}]", p.obj(raw, f"{path}.layers[{i}]")
        layers.append(AlignmentLayer(layer=p.integer(row, "layer", at, required=True), cosine=p.num(row, "cosine", at),
                                     max_rel_err=p.num(row, "max_rel_err", at),
                                     passed=bool(p.boolean(row, "passed", at))))
    for i, raw in enumerate(p.arr(e2e.get("divergences"), f"{path}.e2e.divergences", max_items=MAX_DIVERGENCES)):
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
                  text_path_ok=bool(p.boolean(s, "text_path_ok", path)))
    for key in ("chat_path_ok", "image_path_ok", "has_chat_template"):
        p.boolean(s, key, path)
    return lambda result: ServeReport.objects.create(result=result, **fields) and None


def _bench(s: dict[str, Any], path: str) -> Saver:
    points = []
    runs = s.get("runs")
    if not isinstance(runs, list):
        raise p.fail(f"{path}.runs", "must be a list of concurrency levels")
    if len(runs) > MAX_BENCH_RUNS:
        raise p.fail(f"{path}.runs", f"has {len(runs)} runs; at most {MAX_BENCH_RUNS} are accepted")
    # the runtime's benchmark reports the server's peak once, for the whole sweep; a run may carry its own
    sweep_peak = p.integer(s, "peak_memory_bytes", path)
    for i, raw in enumerate(runs):
        at, row = f"{path}.runs[{i}]", p.obj(raw, f"{path}.runs[{i}]")
        values: dict[str, Any] = {}
        for metric in LATENCY_METRICS:
            stats = p.obj(row.get(metric), f"{at}.{metric}", required=False)
            for stat in LATENCY_STATS:
                values[f"{metric}_{stat}"] = p.num(stats, stat, f"{at}.{metric}")
        concurrency = p.integer(row, "concurrency", at, required=True, low=1, high=MAX_CONCURRENCY)
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
        events.publish(events.benchmark_recorded, run_id=run.pk)  # its regressions alert subscribers

    return save


def _env(s: dict[str, Any], path: str) -> Saver:
    fields = dict(runtime_commit=p.text(s, "runtime_commit", path, max_length=64), torch=p.text(s, "torch", path, max_length=64),
                  python=p.text(s, "python", path, max_length=64), device=p.text(s, "device", path, max_length=200),
                  device_count=p.integer(s, "device_count", path),
                  dispatch_key=p.text(s, "dispatch_key", path, max_length=64),
                  driver=p.text(s, "driver", path, max_length=200))
    return lambda result: EnvLock.objects.create(result=result, **fields) and None


COMM_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"})
COMM_MAX_ROWS, COMM_MAX_SIZES = 256, 64


def _comm(s: dict[str, Any], path: str) -> Saver:
    """The collectives report: bounded rows of known ops, each size's numbers non-negative; the section itself
    (on StageResult) is the stored evidence."""
    p.integer(s, "ranks", path, required=True, low=1, high=65536)
    for i, raw in enumerate(p.arr(s.get("collectives"), f"{path}.collectives", max_items=COMM_MAX_ROWS)):
        at = f"{path}.collectives[{i}]"
        row = p.obj(raw, at)
        if p.text(row, "op", at, max_length=32, required=True) not in COMM_OPS:
            raise p.fail(f"{at}.op", f"unknown collective; collectives are {', '.join(sorted(COMM_OPS))}")
        p.text(row, "dtype", at, max_length=32, required=True)
        p.boolean(row, "ok", at, required=True)
        for j, raw_size in enumerate(p.arr(row.get("sizes"), f"{at}.sizes", max_items=COMM_MAX_SIZES)):
            sat = f"{at}.sizes[{j}]"
            size = p.obj(raw_size, sat)
            p.integer(size, "bytes", sat, required=True, low=0)
            latency = p.obj(size.get("latency_us"), f"{sat}.latency_us", required=False)
            for where, values, key in [(sat, size, k) for k in ("algbw_gbps", "busbw_gbps")] + [
                    (f"{sat}.latency_us", latency, k) for k in ("p50", "p99", "max")]:
                if (p.num(values, key, where) or 0) < 0:
                    raise p.fail(f"{where}.{key}", "must not be negative")
    return lambda result: None


def _eval(s: dict[str, Any], path: str) -> Saver:
    p.boolean(s, "passed", path)
    tasks = s.get("tasks")
    for i, raw in enumerate(p.arr(tasks, f"{path}.tasks", max_items=MAX_EVAL_TASKS) if isinstance(tasks, list) else []):
        at, row = f"{path}.tasks[{i}]", p.obj(raw, f"{path}.tasks[{i}]")
        p.text(row, "task", at)
        p.num(row, "reference", at), p.num(row, "target", at)
        p.integer(row, "n", at, low=0)
    needle = p.obj(s.get("needle"), f"{path}.needle", required=False)
    for key in ("lengths", "depths", "reference", "target"):
        p.arr(needle.get(key), f"{path}.needle.{key}", max_items=MAX_NEEDLE_CELLS)
    return lambda result: None  # the section itself (on StageResult) is the evidence


MAX_SOAK_WINDOWS = 10_000


def _soak(s: dict[str, Any], path: str) -> Saver:
    """The soak section: bounded windows of numbers; the section (on StageResult) is the evidence."""
    p.boolean(s, "passed", path)
    for key in ("seconds", "memory_slope", "recover_seconds"):
        p.num(s, key, path)
    p.integer(s, "crashes", path, low=0)
    windows = s.get("windows")
    for i, raw in enumerate(p.arr(windows, f"{path}.windows", max_items=MAX_SOAK_WINDOWS)):
        at, row = f"{path}.windows[{i}]", p.obj(raw, f"{path}.windows[{i}]")
        p.num(row, "t", at), p.num(row, "output_tok_s", at), p.integer(row, "rss_bytes", at, low=0)
    return lambda result: None


MAX_CONFORMANCE_ROW_BYTES = 64 * 1024  # a row's target and reference as JSON: a few dozen short answers


def _conformance(s: dict[str, Any], path: str) -> Saver:
    """The conformance section: at most ``verdicts.conformance.MAX_ROWS`` check rows, each a known check with its
    target and reference bounded; the section (on StageResult) is the evidence, rows recomputed by the verdict."""
    for key in ("template_declares_tools", "thinking", "passed"):
        p.boolean(s, key, path)
    p.integer(s, "repeats", path, low=1, high=100)
    rows = p.arr(s.get("checks"), f"{path}.checks", max_items=conformance_verdict.MAX_ROWS)
    for i, raw in enumerate(rows):
        at = f"{path}.checks[{i}]"
        row = p.obj(raw, at)
        check = p.text(row, "check", at, max_length=64, required=True)
        if check not in ALL_CHECKS:
            raise p.fail(f"{at}.check", f"unknown check {check!r}; checks are {', '.join(ALL_CHECKS)}")
        p.text(row, "detail", at, max_length=2000)
        p.check_numbers(row.get("target"), f"{at}.target"), p.check_numbers(row.get("reference"), f"{at}.reference")
        if len(json.dumps([row.get("target"), row.get("reference")], default=str)) > MAX_CONFORMANCE_ROW_BYTES:
            raise p.fail(at, f"target and reference are larger than {MAX_CONFORMANCE_ROW_BYTES} bytes of JSON")
    return lambda result: None


PARSERS: dict[str, Callable[[dict[str, Any], str], Saver]] = {
    "plan": _plan, "load": _load, "inventory": _inventory, "align": _align, "serve": _serve, "bench": _bench,
    "env": _env, "eval": _eval, "comm": _comm, "soak": _soak, "reference": parse_reference,
    "conformance": _conformance,
}
assert set(PARSERS) == set(STAGE_ORDER)


def parse_stage_section(stage: str, section: Any) -> Saver:
    """Validates one stage's section (the types ``contract.sections`` gives its values, then the bounds and
    rules of its parser); returns what writes its rows. Raises ``ValidationError`` naming the path."""
    if stage not in PARSERS:
        raise p.fail("stage", f"unknown stage {stage!r}; stages are {', '.join(STAGE_ORDER)}")
    section = p.obj(section, f"stages.{stage}")
    for path, message in type_problems(stage, section)[:1]:  # the contract's types, as the pipeline
        raise p.fail(path, message)
    return PARSERS[stage](section, f"stages.{stage}")


@transaction.atomic
def do_record_stage_results(job: Job, sections: dict[str, dict[str, Any]]) -> list[StageResult]:
    """Stores validated sections of ``job`` (replacing earlier results of the same stages) as evidence rows,
    each with the portal's verdict (``contract.verdicts``: the numbers in the section judged with the
    job's thresholds over the versioned defaults) beside the agent's claimed flag. Every section is validated
    (types, bounds) before the first write. A load's weight samples and probe answers are kept apart from the
    stored section (``weights``); a passing load of the reference run records the release's manifest when it
    has none (``manifests``). A vendor's load never changes the release."""
    for stage, section in sections.items():
        p.check_numbers(section, f"stages.{stage}")
    savers = {stage: parse_stage_section(stage, section) for stage, section in sections.items()}
    held = weights.hold_load_secrets(job, sections.get("load"))
    overrides = job.spec.get("thresholds") or {}
    synthetic = bool(job.spec.get("seeded"))
    StageResult.objects.filter(job=job, stage__in=list(sections)).delete()
    results = []
    # load first: its verdict (and a reference run's manifest) is what later sections of the same report rely on
    context = None  # built once, and again after a load (a reference run's load may give the release its manifest)
    for stage in sorted(sections, key=lambda name: name != "load"):
        section = sections[stage]
        context = context or judging_context(job, sections)
        verdict = verdicts.judge(stage, section, overrides, context)
        result = StageResult.objects.create(
            job=job, stage=stage, passed=verdict.passed, verdict=verdict.status, reasons=verdict.reasons,
            verdict_notes=verdict.notes, defaults_version=verdict.defaults_version,
            custom_thresholds=verdict.custom_thresholds, claimed_passed=verdicts.claimed(stage, section),
            synthetic=synthetic, section=held.stored_section if stage == "load" and held else section,
            challenge_scores=context.challenge.scores.get(stage) if context.challenge is not None else None,
        )
        result.job = job
        savers[stage](result)
        if stage == "load":
            if verdict.passed and is_reference_job(job):
                manifests.record_reference_load(job, section)
            if held:
                held.save(job, verdict.passed)
            context = None
        if stage == "eval":
            queue_rerun(result)  # code the reference run did not run: the portal's worker runs it
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
