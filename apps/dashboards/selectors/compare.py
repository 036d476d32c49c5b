"""Two runs side by side: benchmarks per concurrency (with the ratio b / a; the communication overhead,
TPOT jitter and expert imbalance from the bench sections' runs), alignment, environment lock, and what each stage
concluded. Five queries whatever the runs hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.accounts.access import Actor
from apps.benchmarks.regressions import Direction, metric_direction
from apps.benchmarks.run_metrics import run_values
from apps.evidence.models import BenchmarkPoint, StageResult
from apps.jobs.models import Job
from apps.jobs.selectors import visible_jobs

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
    envs = [getattr(results[j].get("env"), "env", None) for j in (a_id, b_id)]
    if any(envs):
        for name in ENV_FIELDS:
            va, vb = (getattr(x, name, None) for x in envs)
            out.env.append(Cmp(name.replace("_", " "), va, vb, verdict="same" if va == vb else "differs"))
    return out
