"""The cell page: a model on a hardware, its tier ladder, plan, checklist, alignment, benchmarks and jobs.

A fixed number of queries whatever the number of jobs, runs or events: newest rows are picked in the database
(a correlated subquery per stage), never by reading a cell's whole history."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.paginator import Page, Paginator

from apps.accounts.access import Actor
from apps.catalog.engines import default_engine, engine_jobs_q, resolve_engine
from apps.catalog.models import Engine, Hardware, ModelRelease
from apps.catalog.selectors import visible_models
from apps.core.formatting import hours_text, human_bytes, human_count, reached_times
from apps.dashboards.selectors.jobs import previous_job_ids
from apps.dashboards.selectors.quality import is_quantized, original_e2e, quality_cost_view, quant_facts
from apps.evidence.conformance import conformance_evidence
from apps.evidence.models import (
    AlignmentLayer,
    AlignmentOp,
    BenchmarkPoint,
    LoadProblem,
    OperatorCheck,
    ShardChecksum,
    StageResult,
    TokenDivergence,
)
from apps.evidence.runtime_evidence import bench_extras, compiled_path, section_keys
from apps.evidence.selectors import newest_results
from apps.jobs.models import Job
from apps.matrix.models import Cell
from apps.matrix.selectors import lead_hours
from apps.matrix.series import EngineCell, engine_cells
from apps.references.selectors import portal_scores
from contract.tiers import STAGE_ORDER, TIER_GATES, TIER_NAMES

OPERATOR_STATUSES = ("native", "decomposed", "fallback", "missing")
LADDER_TIERS = tuple(level for level, _ in TIER_GATES)  # 1..6
JOB_PAGE = 20


def _reached_times(cell: Cell | None) -> dict[int, datetime]:
    return reached_times(cell.tier_reached_at) if cell else {}


@dataclass
class LadderStep:
    tier: int
    name: str
    reached_at: datetime | None
    lead_hours: float | None
    current: bool

    @property
    def lead_text(self) -> str:
        return hours_text(self.lead_hours)


def tier_ladder(cell: Cell | None, released_at: datetime | None) -> list[LadderStep]:
    reached = _reached_times(cell)
    tier = cell.tier if cell else 0
    return [LadderStep(t, TIER_NAMES[t], reached.get(t) if t <= tier else None,
                       lead_hours(reached.get(t), released_at) if t <= tier else None, t == tier)
            for t in LADDER_TIERS]


def visible_model(actor: Actor, slug: str) -> ModelRelease | None:
    return visible_models(actor).filter(slug=slug).first()


@dataclass
class CellPage:
    """Everything the cell page shows."""

    model: ModelRelease
    hardware: Hardware
    cell: Cell | None
    ladder: list[LadderStep]
    results: dict[str, StageResult]
    operators: list[dict[str, Any]] = field(default_factory=list)
    operator_counts: dict[str, int] = field(default_factory=dict)
    align_ops: list[AlignmentOp] = field(default_factory=list)
    align_layers: list[AlignmentLayer] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)
    bench_points: list[BenchmarkPoint] = field(default_factory=list)
    load_problems: list[LoadProblem] = field(default_factory=list)
    shards: list[ShardChecksum] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    job_page: Page | None = None
    long_context: dict[str, Any] | None = None  # the bench stage's long-context case
    image_path: dict[str, Any] | None = None  # a model that takes images: its serve checks and vision alignment
    eval_section: dict[str, Any] = field(default_factory=dict)  # the newest eval section
    conformance: dict[str, Any] | None = None  # the newest conformance section's rows (apps.evidence.conformance)
    needle: NeedleHeatmap | None = None  # its needle grids, target and reference paired per cell
    bench_extras: list[dict[str, Any]] = field(default_factory=list)  # per run: comm overhead, jitter, experts
    compiled: dict[str, Any] | None = None  # the serve, bench and align sections' compile blocks, when present
    portal_scores: dict[str, Any] | None = None  # the portal's scores of the raw outputs (align e2e, eval)
    align_self_reference: bool = False  # the target ran the reference implementation (transformers fallback, fp32 CPU)
    engine: Engine | None = None  # the engine whose cell this page shows (the bundled runtime by default)
    engines: list[EngineCell] = field(default_factory=list)  # every engine's cell of this model × hardware
    quant: dict[str, Any] | None = None  # the format and native/emulated (``selectors.quality.quant_facts``)
    quality_cost: dict[str, Any] | None = None  # eval against the unquantised original (``quality_cost_view``)
    quant_e2e: dict[str, Any] | None = None  # align's e2e_original: end to end against the original (``original_e2e``)

    @property
    def verdict_rows(self) -> list[tuple[str, dict[str, Any]]]:
        """The cell's verdicts in pipeline order (plan, load, …), stages the order does not know last (the JSON
        column keeps no key order)."""
        verdicts = (self.cell.verdicts if self.cell is not None else None) or {}
        rank = {stage: i for i, stage in enumerate(STAGE_ORDER)}
        return sorted(verdicts.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0]))

    @property
    def bench_has_experts(self) -> bool:
        return any(r["expert_balance"] for r in self.bench_extras)

    @property
    def stages(self) -> list[tuple[str, StageResult | None]]:
        return [(s, self.results.get(s)) for s in STAGE_ORDER]

    @property
    def plan_facts(self) -> list[tuple[str, str]]:
        plan = getattr(self.results.get("plan"), "plan", None)
        if plan is None:
            return []
        return [
            ("fits", "✓ yes" if plan.fits else "✗ no"),
            ("parameters", f"{human_count(plan.params_total)} total · {human_count(plan.params_active)} active"),
            ("weights", human_bytes(plan.weight_bytes) + (f" ({plan.dtype})" if plan.dtype else "")),
            ("KV cache per token", human_bytes(plan.kv_bytes_per_token)),
            ("longest context", f"{plan.max_context:,} tokens" if plan.max_context else "–"),
            ("largest batch", str(plan.max_batch) if plan.max_batch else "–"),
        ]

    @property
    def memory(self) -> dict[str, Any] | None:
        """Bytes per device of the plan (the job's evidence, else the config estimate) against device memory."""
        plan = getattr(self.results.get("plan"), "plan", None)
        per_device = plan.bytes_per_device if plan is not None else None
        source = f"plan stage of job {self.results['plan'].job_id}" if per_device else ""
        layout = {"tp": plan.tp, "pp": plan.pp, "ep": plan.ep, "devices": plan.devices} if plan is not None else {}
        if not per_device and self.cell is not None and self.cell.fits_plan:
            est = self.cell.fits_plan
            per_device = est.get("bytes_per_device") or est.get("memory_per_device")
            layout = est.get("plan") or {}
            source = "estimate from config.json"
        if not per_device or not self.hardware.memory_bytes:
            return None
        return {"bytes": per_device, "capacity": self.hardware.memory_bytes, "source": source,
                "used_gib": round(per_device / 2**30, 1), "capacity_gib": round(self.hardware.memory_bytes / 2**30, 1),
                "percent": round(100 * per_device / self.hardware.memory_bytes, 1), "layout": layout,
                "high": int(self.hardware.memory_bytes * 0.9)}


@dataclass
class NeedleCell:
    target: float | None
    reference: float | None

    @property
    def below(self) -> bool:
        return self.target is not None and self.reference is not None and self.target < self.reference

    @property
    def on_dark(self) -> bool:  # more than half green: white text reads better
        return self.target is not None and self.target >= 0.5


@dataclass
class NeedleRow:
    length: Any
    cells: list[NeedleCell]


@dataclass
class NeedleHeatmap:
    depths: list[Any]
    rows: list[NeedleRow]
    depth_unit: str = ""
    samples: int | None = None
    distractors: int = 0


def _accuracy(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def needle_heatmap(needle: Any) -> NeedleHeatmap | None:
    """The eval section's needle grids (``target`` and ``reference``, [length][depth]) zipped into rows of paired
    cells, one row per length; None without lengths and both grids. A row or cell one grid lacks shows as
    missing (None) rather than shifting the others."""
    if not isinstance(needle, dict):
        return None
    lengths, target, reference = needle.get("lengths"), needle.get("target"), needle.get("reference")
    if not (isinstance(lengths, list) and lengths and isinstance(target, list) and target
            and isinstance(reference, list) and reference):
        return None
    depths = needle.get("depths") if isinstance(needle.get("depths"), list) else []
    rows = []
    for i in range(max(len(lengths), len(target), len(reference))):
        length = lengths[i] if i < len(lengths) else None
        t_row = target[i] if i < len(target) and isinstance(target[i], list) else []
        r_row = reference[i] if i < len(reference) and isinstance(reference[i], list) else []
        width = max(len(depths), len(t_row), len(r_row))
        rows.append(NeedleRow(length, [NeedleCell(_accuracy(t_row[j]) if j < len(t_row) else None,
                                                  _accuracy(r_row[j]) if j < len(r_row) else None)
                                       for j in range(width)]))
    samples = needle.get("samples")
    return NeedleHeatmap(depths, rows, str(needle.get("depth_unit") or ""),
                         samples if isinstance(samples, int) else None,
                         needle.get("distractors") if isinstance(needle.get("distractors"), int) else 0)


def _top_rows(entries: Any) -> list[dict[str, Any]]:
    """Top-k entries as ``{token, text, logprob}``, whether stored as objects or as ``[token, logprob]`` pairs."""
    rows = []
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict):
            rows.append({"token": e.get("token"), "text": e.get("text"), "logprob": e.get("logprob")})
        elif isinstance(e, list | tuple) and e:
            rows.append({"token": e[0], "text": None, "logprob": e[1] if len(e) > 1 else None})
    return rows


def _e2e_prompts(align: StageResult | None, divergences: list[TokenDivergence]) -> list[dict[str, Any]]:
    """Per prompt: its text, the reference continuation, the first divergence and every recorded one."""
    e2e: dict[str, Any] = {}
    if align is not None:
        raw = StageResult.objects.filter(pk=align.pk).values_list("section__e2e", flat=True).first()
        e2e = raw if isinstance(raw, dict) else {}
    texts = e2e.get("prompt_texts") or []
    refs = e2e.get("ref_texts") or []
    by_prompt: dict[int, list[TokenDivergence]] = {}
    for d in divergences:
        by_prompt.setdefault(d.prompt, []).append(d)
    count = max([len(texts), len(refs), int(e2e.get("prompts") or 0)] + [p + 1 for p in by_prompt])
    prompts = []
    for d in divergences:  # top-5 rows as dicts, and the tokens' text from whichever list holds them
        d.ref_rows, d.target_rows = _top_rows(d.ref_top5), _top_rows(d.target_top5)
        texts_by_id = {e["token"]: e["text"] for e in [*d.ref_rows, *d.target_rows] if e["text"] is not None}
        d.ref_text = texts_by_id.get(d.ref_token)
        d.target_text = texts_by_id.get(d.target_token)
    for i in range(count):
        divs = sorted(by_prompt.get(i, []), key=lambda d: d.position)
        prompts.append({"index": i, "text": texts[i] if i < len(texts) else "",
                        "reference": refs[i] if i < len(refs) else "",
                        "first": divs[0] if divs else None, "divergences": divs})
    return prompts


def cell_page(actor: Actor, model_slug: str, hardware_slug: str, *, jobs_page: Any = 1,
              engine_ref: str = "") -> CellPage | None:
    """The cell of ``engine_ref`` (``NAME``/``NAME@VERSION``; default the bundled runtime): its evidence from that
    engine's jobs, or None when the model is not visible to ``actor``, a slug or the engine is unknown; its job
    history one page (``JOB_PAGE`` jobs, newest first) at a time; every engine's cell of the model × hardware."""
    model = visible_model(actor, model_slug)
    hardware = Hardware.objects.filter(slug=hardware_slug).first()
    if model is None or hardware is None:
        return None
    try:
        engine = resolve_engine(engine_ref) if engine_ref else default_engine()
    except ValidationError:
        return None
    cell = Cell.objects.filter(model=model, hardware=hardware, engine=engine).first()
    results = newest_results(model.pk, hardware.pk, engine_jobs_q(engine, "job__"))
    page = CellPage(model, hardware, cell, tier_ladder(cell, model.released_at), results, engine=engine,
                    engines=engine_cells(model.pk, hardware.pk))
    if "inventory" in results:
        page.operators = list(OperatorCheck.objects.filter(result_id=results["inventory"].pk)
                              .order_by("status", "-count", "op").values("op", "count", "dtypes", "status",
                                                                          "decomposes_to"))
        page.operator_counts = {s: 0 for s in OPERATOR_STATUSES}
        for row in page.operators:
            page.operator_counts[row["status"]] = page.operator_counts.get(row["status"], 0) + 1
    report = getattr(results.get("align"), "alignment", None)
    if report is not None:
        page.align_ops = list(AlignmentOp.objects.filter(report=report).order_by("passed", "op"))
        page.align_layers = list(AlignmentLayer.objects.filter(report=report).order_by("layer"))
        divergences = list(TokenDivergence.objects.filter(report=report).order_by("prompt", "position"))
        page.prompts = _e2e_prompts(results.get("align"), divergences)
    run = getattr(results.get("bench"), "benchmark", None)
    if run is not None:
        page.bench_points = list(BenchmarkPoint.objects.filter(run=run).order_by("concurrency"))
    load = getattr(results.get("load"), "load", None)
    if load is not None:
        page.load_problems = list(LoadProblem.objects.filter(load=load).order_by("tensor")[:200])
        page.shards = list(ShardChecksum.objects.filter(load=load).order_by("file")[:200])
    page.job_page = Paginator(Job.objects.filter(engine_jobs_q(engine), model=model, hardware=hardware)
                              .select_related("requested_by")
                              .order_by("-created_at", "-id"), JOB_PAGE).get_page(jobs_page)
    page.jobs = list(page.job_page.object_list)
    # "compare with the job before" of the same purpose: a certify job is never compared with a reference run
    unmatched = []
    for i, newer in enumerate(page.jobs):
        older = next((j for j in page.jobs[i + 1:] if j.purpose == newer.purpose), None)
        newer.previous_id = older.pk if older is not None else None
        if older is None:
            unmatched.append(newer)
    previous = previous_job_ids(unmatched)
    for job in unmatched:
        job.previous_id = previous.get(job.pk)
    keys = section_keys(results)  # the serve, bench and align sections' runs, long-context run, compile blocks
    raw = keys.get("bench", {}).get("long_context")
    page.long_context = raw if isinstance(raw, dict) else None
    if "eval" in results:
        raw = StageResult.objects.filter(pk=results["eval"].pk).values_list("section", flat=True).first()
        page.eval_section = raw if isinstance(raw, dict) else {}
        page.needle = needle_heatmap(page.eval_section.get("needle"))
    page.bench_extras = bench_extras(keys.get("bench"))
    page.compiled = compiled_path(results, keys)
    page.align_self_reference = keys.get("align", {}).get("fallback_reference_identical") is True
    page.portal_scores = portal_scores(results.get("align"), results.get("eval"))
    page.conformance = conformance_evidence(results.get("conformance"))
    page.quant = quant_facts(model, results)
    original = visible_model(actor, model.quantized_from.slug) if model.quantized_from_id else None
    page.quality_cost = quality_cost_view(original, hardware, results)
    page.quant_e2e = original_e2e(results) if is_quantized(model) else None  # (no query for an unquantised release)
    if model.takes_images:
        page.image_path = image_path_evidence(results.get("serve"), results.get("align"))
    return page


def image_path_evidence(serve: StageResult | None, align: StageResult | None) -> dict[str, Any]:
    """The image path's evidence from the newest serve and align sections (only their image keys are read: the
    sections are large): ``ok`` (the serve stage's ``image_path_ok``; None when not exercised), its image
    checks, and the vision alignment rows and image + text e2e."""
    ids = [r.pk for r in (serve, align) if r is not None]
    raw = {pk: (ok, checks, vision) for pk, ok, checks, vision in StageResult.objects.filter(pk__in=ids).values_list(
        "pk", "section__image_path_ok", "section__checks", "section__vision")}
    ok, checks, _ = raw.get(serve.pk, (None, None, None)) if serve is not None else (None, None, None)
    vision = raw.get(align.pk, (None, None, None))[2] if align is not None else None
    vision = vision if isinstance(vision, dict) else {}
    checks = [c for c in checks if isinstance(c, dict) and str(c.get("name", "")).startswith("image")] \
        if isinstance(checks, list) else []
    e2e = [p for p in vision.get("e2e") or [] if isinstance(p, dict)]
    return {"ok": ok, "serve_job": serve.job_id if serve is not None else None, "checks": checks,
            "vision_passed": vision.get("passed"), "rows": [r for r in vision.get("rows") or [] if isinstance(r, dict)],
            "e2e": [{"prompt": p.get("prompt"), "image": p.get("image"), "match": p.get("match"),
                     "tokens": len(p.get("reference") or [])} for p in e2e]}
