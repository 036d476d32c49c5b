"""Two runs side by side: benchmarks per concurrency (with the ratio b / a; the communication overhead,
TPOT jitter and expert imbalance from the bench sections' runs), alignment, environment lock, and what each stage
concluded. Five queries whatever the runs hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError

from apps.accounts.access import Actor
from apps.benchmarks.regressions import Direction, metric_direction
from apps.benchmarks.run_metrics import run_values
from apps.catalog.engines import engine_jobs_q, resolve_engine
from apps.catalog.models import Hardware
from apps.catalog.selectors import visible_models
from apps.evidence.models import BenchmarkPoint, StageResult
from apps.jobs.choices import JobPurpose
from apps.jobs.models import Job
from apps.jobs.selectors import visible_jobs
from contract.version_lock import flatten_lock, lock_diff

COMPARED_METRICS = (("ttft_ms_p50", "TTFT p50", "ms"), ("ttft_ms_p99", "TTFT p99", "ms"),
                    ("tpot_ms_p50", "TPOT p50", "ms"), ("itl_ms_p50", "ITL p50", "ms"),
                    ("e2e_ms_p50", "E2E p50", "ms"), ("e2e_ms_p99", "E2E p99", "ms"),
                    ("output_tok_s", "output tok/s", "tok/s"), ("req_s", "req/s", "req/s"))
# read from each run of the bench section (``benchmarks.run_metrics``), shown when either side reports them
COMPARED_RUN_METRICS = (("comm_overhead_ratio", "comm overhead (rank 0)", "%"),
                        ("comm_overhead_ratio_max", "comm overhead (slowest rank)", "%"),
                        ("tpot_jitter", "TPOT jitter p99/p50", "×"), ("expert_max_over_mean", "expert max/mean", "×"),
                        ("expert_ep_max_over_mean", "EP rank max/mean", "×"))
ENV_FIELDS = ("runtime_commit", "torch", "python", "device", "device_count", "dispatch_key", "driver")
ALIGN_FIELDS = (("passed", "passed"), ("token_match_rate", "token match rate"), ("perplexity_ref", "perplexity (ref)"),
                ("perplexity_target", "perplexity (target)"), ("kv_passed", "KV cache consistent"),
                ("kv_max_abs_err", "KV max abs err"))
WORSE_BEYOND = 0.05  # a change of more than 5 % the wrong way is marked worse, the right way better


@dataclass
class Cmp:
    label: str
    a: Any
    b: Any
    unit: str = ""
    ratio: float | None = None
    verdict: str = ""  # better | worse | same | differs | ""


def _ratio(metric: str, a: Any, b: Any) -> tuple[float | None, str]:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or a <= 0:
        return None, ""
    ratio = b / a
    lower_better = metric_direction(metric) is Direction.LOWER_IS_BETTER
    if abs(ratio - 1) <= WORSE_BEYOND:
        return ratio, "same"
    return ratio, "worse" if (ratio > 1) == lower_better else "better"


@dataclass
class Comparison:
    a: Job
    b: Job
    bench: list[tuple[int, list[Cmp]]] = field(default_factory=list)  # per concurrency
    alignment: list[Cmp] = field(default_factory=list)
    env: list[Cmp] = field(default_factory=list)
    stages: list[Cmp] = field(default_factory=list)
    evals: list[Cmp] = field(default_factory=list)  # per eval task: the target score of each run
    lock: list[Cmp] = field(default_factory=list)  # the version lock, entries that differ first
    engines: tuple[str, str] | None = None  # an engine comparison: the two engines compared

    @property
    def lock_differs(self) -> list[str]:
        return [row.label for row in self.lock if row.verdict == "differs"]

    @property
    def same_cell(self) -> bool:
        return (self.a.model_id, self.a.hardware_id) == (self.b.model_id, self.b.hardware_id)


def compare_jobs(actor: Actor, a_id: int, b_id: int) -> Comparison | None:
    """None when either job is unknown or invisible to ``actor``."""
    jobs = {j.pk: j for j in visible_jobs(actor).select_related("model", "hardware").filter(pk__in=[a_id, b_id])}
    if a_id not in jobs or b_id not in jobs:
        return None
    out = Comparison(jobs[a_id], jobs[b_id])
    results: dict[int, dict[str, StageResult]] = {a_id: {}, b_id: {}}
    for r in (StageResult.objects.filter(job_id__in=[a_id, b_id]).select_related("alignment", "env", "benchmark")
              .defer("section").order_by("job_id", "stage", "-created_at", "-id")):
        results[r.job_id].setdefault(r.stage, r)
    stages = sorted(set(results[a_id]) | set(results[b_id]))
    for stage in stages:
        ra, rb = results[a_id].get(stage), results[b_id].get(stage)
        va = ra.verdict if ra else "not run"
        vb = rb.verdict if rb else "not run"
        out.stages.append(Cmp(stage, va, vb, verdict="same" if va == vb else "differs"))
    run_ids = {job: getattr(results[job].get("bench"), "benchmark", None) for job in (a_id, b_id)}
    points: dict[int, dict[int, BenchmarkPoint]] = {a_id: {}, b_id: {}}
    ids = {run.pk: job for job, run in run_ids.items() if run is not None}
    for p in BenchmarkPoint.objects.filter(run_id__in=list(ids)):
        points[ids[p.run_id]][p.concurrency] = p
    names = [m for m, _, _ in COMPARED_RUN_METRICS]
    extras: dict[int, dict[int, dict[str, float | None]]] = {a_id: {}, b_id: {}}
    bench_ids = {results[job]["bench"].pk: job for job in (a_id, b_id) if "bench" in results[job]}
    for pk, runs in StageResult.objects.filter(pk__in=list(bench_ids)).values_list("pk", "section__runs"):
        for conc, values in run_values(runs, names):
            extras[bench_ids[pk]][conc] = dict(zip(names, values, strict=True))
    for conc in sorted(set(points[a_id]) | set(points[b_id])):
        pa, pb = points[a_id].get(conc), points[b_id].get(conc)
        row = []
        for metric, label, unit in COMPARED_METRICS:
            va, vb = getattr(pa, metric, None), getattr(pb, metric, None)
            ratio, verdict = _ratio(metric, va, vb)
            row.append(Cmp(label, va, vb, unit, ratio, verdict))
        ea, eb = extras[a_id].get(conc, {}), extras[b_id].get(conc, {})
        for metric, label, unit in COMPARED_RUN_METRICS:
            va, vb = ea.get(metric), eb.get(metric)
            if va is None and vb is None:
                continue
            ratio, verdict = _ratio(metric, va, vb)
            scale = 100 if unit == "%" else 1  # a fraction of step time shown as a percentage
            row.append(Cmp(label, None if va is None else va * scale, None if vb is None else vb * scale, unit,
                           ratio, verdict))
        out.bench.append((conc, row))
    aligns = [getattr(results[j].get("align"), "alignment", None) for j in (a_id, b_id)]
    if any(aligns):
        for name, label in ALIGN_FIELDS:
            va, vb = (getattr(x, name, None) for x in aligns)
            out.alignment.append(Cmp(label, va, vb, verdict="same" if va == vb else "differs"))
    sections: dict[tuple[int, str], Any] = {}
    wanted = [r.pk for j in (a_id, b_id) for stage, r in results[j].items() if stage in ("serve", "env", "eval")]
    for job_id, stage, section in StageResult.objects.filter(pk__in=wanted).values_list("job_id", "stage", "section"):
        sections[(job_id, stage)] = section
    locks = [flatten_lock(sections.get((j, "serve")), sections.get((j, "env"))) for j in (a_id, b_id)]
    out.lock = [Cmp(key, va, vb, verdict="differs" if differs else "same") for key, va, vb, differs in lock_diff(*locks)]
    out.evals = eval_rows(sections.get((a_id, "eval")), sections.get((b_id, "eval")))
    envs = [getattr(results[j].get("env"), "env", None) for j in (a_id, b_id)]
    if any(envs):
        for name in ENV_FIELDS:
            va, vb = (getattr(x, name, None) for x in envs)
            out.env.append(Cmp(name.replace("_", " "), va, vb, verdict="same" if va == vb else "differs"))
    return out


def _tasks(section: Any) -> dict[str, dict[str, Any]]:
    tasks = section.get("tasks") if isinstance(section, dict) else None
    return {str(t.get("task")): t for t in tasks or [] if isinstance(t, dict) and t.get("task")}


def eval_rows(a: Any, b: Any) -> list[Cmp]:
    """Per eval task of either run: the target's score on each side (its metric as the unit), B / A, and the
    task's own verdict when it changed."""
    ta, tb = _tasks(a), _tasks(b)
    rows = []
    for task in sorted(set(ta) | set(tb)):
        xa, xb = ta.get(task, {}), tb.get(task, {})
        va, vb = xa.get("target"), xb.get("target")
        ratio = vb / va if isinstance(va, int | float) and isinstance(vb, int | float) and va else None
        passed = (xa.get("passed"), xb.get("passed"))
        verdict = "same" if va == vb else ("worse" if isinstance(va, int | float) and isinstance(vb, int | float)
                                          and vb < va else "differs")
        if passed[0] is True and passed[1] is False:
            verdict = "worse"
        rows.append(Cmp(task, va, vb, str(xa.get("metric") or xb.get("metric") or ""), ratio, verdict))
    return rows


def compare_engines(actor: Actor, model_slug: str, hardware_slug: str, a_ref: str,
                    b_ref: str) -> Comparison | str | None:
    """Two engines (or two versions of one) on one model × hardware: each engine's newest certify job of that
    cell with evidence, compared as ``compare_jobs`` compares two runs. None when the model or hardware is not
    visible; a text naming what is missing when an engine is unknown or has no run there."""
    if not (visible_models(actor).filter(slug=model_slug).exists()
            and Hardware.objects.filter(slug=hardware_slug).exists()):
        return None
    jobs = visible_jobs(actor).filter(model__slug=model_slug, hardware__slug=hardware_slug,
                                      purpose=JobPurpose.CERTIFY, stage_results__isnull=False)
    picked = []
    for ref in (a_ref, b_ref):
        try:
            engine = resolve_engine(ref)
        except ValidationError as exc:
            return "; ".join(exc.message_dict.get("engine", [str(exc)]))
        job = jobs.filter(engine_jobs_q(engine)).order_by("-created_at", "-id").values_list("pk", flat=True).first()
        if job is None:
            return f"{engine.ref} has no run of {model_slug} on {hardware_slug} yet"
        picked.append((engine.ref, job))
    out = compare_jobs(actor, picked[0][1], picked[1][1])
    if out is not None:
        out.engines = (picked[0][0], picked[1][0])
    return out
