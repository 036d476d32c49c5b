"""Read side of the dashboard pages: a cell's evidence, a job's console, the Day-0 timeline.

Each function costs a fixed number of queries whatever the number of jobs, runs or events: newest rows are
picked in the database (a correlated subquery per stage), never by reading a cell's whole history."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from statistics import median
from typing import Any

from django.db.models import Max, Subquery
from django.utils.dateparse import parse_datetime

from agents.pipeline.tiers import STAGE_ORDER, TIER_GATES, TIER_NAMES
from apps.accounts.access import Actor
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import visible_models, visible_models_q
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
from apps.evidence.selectors import newest_results
from apps.jobs.models import Job, JobEvent
from apps.jobs.selectors import visible_jobs
from apps.jobs.services import can_cancel_job
from apps.matrix.models import Cell
from apps.matrix.selectors import lead_hours

OPERATOR_STATUSES = ("native", "decomposed", "fallback", "missing")
LADDER_TIERS = tuple(level for level, _ in TIER_GATES)  # 1..6
DAY0_TIERS = (2, 3, 4, 5, 6)  # loads, serves, aligned, baselined, validated
CONSOLE_LINES = 500


def hours_text(hours: float | None) -> str:
    """Lead time for people: "+5.2 h", "+3.1 d", "−12 h (before release)"; "" when not reached."""
    if hours is None:
        return ""
    sign = "−" if hours < 0 else "+"
    h = abs(hours)
    text = f"{sign}{h:.1f} h" if h < 72 else f"{sign}{h / 24:.1f} d"
    return text + (" (before release)" if hours < 0 else "")


def _reached_times(cell: Cell | None) -> dict[int, datetime]:
    out: dict[int, datetime] = {}
    for key, raw in ((cell.tier_reached_at or {}) if cell else {}).items():
        when = parse_datetime(raw) if isinstance(raw, str) else None
        if when is not None and str(key).isdigit():
            out[int(key)] = when
    return out


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


def human_count(n: int | None) -> str:
    """116_829_156_672 -> "116.8 B"."""
    if n is None:
        return "–"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


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


def cell_page(actor: Actor, model_slug: str, hardware_slug: str) -> CellPage | None:
    """The cell's evidence, or None when the model is not visible to ``actor`` or a slug is unknown."""
    model = visible_model(actor, model_slug)
    hardware = Hardware.objects.filter(slug=hardware_slug).first()
    if model is None or hardware is None:
        return None
    cell = Cell.objects.filter(model=model, hardware=hardware).first()
    results = newest_results(model.pk, hardware.pk)
    page = CellPage(model, hardware, cell, tier_ladder(cell, model.released_at), results)
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
    page.jobs = list(Job.objects.filter(model=model, hardware=hardware).select_related("requested_by")
                     .order_by("-created_at", "-id")[:20])
    return page


# --- job console ------------------------------------------------------------------------------------------


@dataclass
class StageStatus:
    stage: str
    status: str  # pending | running | done | failed
    done: int | None = None
    total: int | None = None
    what: str = ""
    seconds: float | None = None

    @property
    def percent(self) -> int | None:
        return round(100 * self.done / self.total) if self.done is not None and self.total else None


@dataclass
class JobPage:
    job: Job
    stages: list[StageStatus]
    events: list[JobEvent]
    earlier: int
    last_seq: int
    can_cancel: bool


def job_page(actor: Actor, job_id: int) -> JobPage | None:
    """The job (None when invisible), its stage timeline and its newest log lines (a fixed number of queries)."""
    job = visible_jobs(actor).filter(pk=job_id).first()
    if job is None:
        return None
    # Up to the highest contiguous seq stored: the WebSocket replays from there, in order, so an event
    # after a gap is shown once, when the gap fills.
    last_seq = job.events_acked
    events = JobEvent.objects.filter(job=job, seq__lte=last_seq)
    lines = events.exclude(kind="progress").only("seq", "ts", "stage", "kind", "level", "message")
    shown = list(lines.order_by("-seq")[:CONSOLE_LINES])[::-1]
    earlier = lines.filter(seq__lt=shown[0].seq).count() if len(shown) == CONSOLE_LINES else 0
    names = list(job.stages)
    status: dict[str, StageStatus] = {}
    marks = events.filter(kind__in=("stage_started", "stage_finished")).order_by("seq").values_list(
        "stage", "kind", "data__passed", "data__seconds")
    for stage, kind, passed, seconds in marks:
        s = status.setdefault(stage, StageStatus(stage, "running"))
        if kind == "stage_finished":
            s.status = "failed" if passed is False else "done"
            s.seconds = seconds if isinstance(seconds, int | float) else None
        if stage not in names:
            names.append(stage)
    newest_progress = (events.filter(kind="progress").values("stage").annotate(seq=Max("seq")).values("seq"))
    for stage, data in events.filter(kind="progress", seq__in=Subquery(newest_progress)).values_list("stage", "data"):
        s = status.setdefault(stage, StageStatus(stage, "running"))
        if isinstance(data, dict) and isinstance(data.get("total"), int | float) and data["total"] > 0:
            s.done, s.total, s.what = int(data.get("done") or 0), int(data["total"]), str(data.get("what") or "")
        if stage not in names:
            names.append(stage)
    stages = [status.get(n) or StageStatus(n, "pending") for n in names]
    return JobPage(job, stages, shown, earlier, last_seq, can_cancel_job(actor, job))


# --- Day-0 timeline ---------------------------------------------------------------------------------------


@dataclass
class Day0Row:
    hardware: Hardware
    hours: list[float | None]  # one per DAY0_TIERS
    tier: int
    failed_stage: str

    @property
    def cells(self) -> list[tuple[float | None, str, str]]:
        return [(h, hours_text(h), f"→ {TIER_NAMES[t]}") for h, t in zip(self.hours, DAY0_TIERS, strict=True)]

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]


@dataclass
class Day0Release:
    model: ModelRelease
    rows: list[Day0Row]
    untested: int


@dataclass
class LeaderRow:
    hardware: Hardware
    medians: list[float | None]  # one per DAY0_TIERS
    reached: list[int]
    rank_hours: float | None

    @property
    def cells(self) -> list[tuple[float | None, str, int, str]]:
        return [(h, hours_text(h), n, f"median → {TIER_NAMES[t]}")
                for h, n, t in zip(self.medians, self.reached, DAY0_TIERS, strict=True)]


@dataclass
class Day0Timeline:
    releases: list[Day0Release]
    leaderboard: list[LeaderRow]
    rank_tier: int
    tiers: list[tuple[int, str]]


def day0_timeline(actor: Actor, *, rank_tier: int = 3) -> Day0Timeline:
    """For each visible release (newest first), hours from release to each tier on each hardware; and the
    hardware ranked by median lead time to ``rank_tier`` (three queries)."""
    if rank_tier not in DAY0_TIERS:
        raise ValueError(f"tier must be one of {', '.join(map(str, DAY0_TIERS))}, got {rank_tier}")
    models = list(ModelRelease.objects.filter(visible_models_q(actor), released_at__isnull=False)
                  .only("id", "slug", "name", "released_at", "visibility", "family"))
    hardware = list(Hardware.objects.only("id", "slug", "name", "vendor"))
    cells = {(m, h): (tier, failed, reached) for m, h, tier, failed, reached in
             Cell.objects.filter(model_id__in=[m.pk for m in models])
             .values_list("model_id", "hardware_id", "tier", "failed_stage", "tier_reached_at")}
    per_hw: dict[int, list[list[float]]] = {h.pk: [[] for _ in DAY0_TIERS] for h in hardware}
    releases = []
    for m in models:
        rows, untested = [], 0
        for h in hardware:
            tier, failed, reached = cells.get((m.pk, h.pk), (0, "", {}))
            times = {int(k): parse_datetime(v) for k, v in (reached or {}).items() if str(k).isdigit()}
            hours = [lead_hours(times.get(t), m.released_at) if t <= tier else None for t in DAY0_TIERS]
            if tier < DAY0_TIERS[0] and not failed:
                untested += 1
                continue
            rows.append(Day0Row(h, hours, tier, failed))
            for i, value in enumerate(hours):
                if value is not None:
                    per_hw[h.pk][i].append(value)
        rows.sort(key=lambda r: (-r.tier, r.hours[0] if r.hours[0] is not None else float("inf")))
        releases.append(Day0Release(m, rows, untested))
    board = []
    rank_index = DAY0_TIERS.index(rank_tier)
    for h in hardware:
        lists = per_hw[h.pk]
        medians = [median(v) if v else None for v in lists]
        board.append(LeaderRow(h, medians, [len(v) for v in lists], medians[rank_index]))
    board.sort(key=lambda r: (r.rank_hours is None, r.rank_hours if r.rank_hours is not None else 0,
                              r.hardware.slug))
    return Day0Timeline(releases, board, rank_tier, [(t, TIER_NAMES[t]) for t in DAY0_TIERS])
