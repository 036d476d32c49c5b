"""Seeded evidence for development, demos and tests: adaptation jobs soon after each release (some failing at
a stage), and a history of daily benchmark runs with a planted regression.

Everything goes through the portal's services (job transitions, result ingest with the portal's verdicts,
cell recomputation, event storage). The seeded time is an explicit ``Clock`` handed to every step: after each
service call the rows it wrote are stamped with the clock's time (``_stamp``) and the cell recomputed at it,
so rows, tier-reached times and lead times carry historic timestamps as if the jobs had run then. Seeded jobs
are created as rows (``spec.seeded``) rather than through ``do_create_job``, which would hand them to real
agents; their evidence is marked ``synthetic`` everywhere it is shown."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction

from apps.benchmarks import sections as sec
from apps.catalog.models import Hardware, ModelRelease
from apps.core import events
from apps.evidence.ingest import do_record_job_results
from apps.evidence.models import BenchmarkRun, StageResult
from apps.jobs.choices import JobState
from apps.jobs.eventlog import do_store_job_events, parse_event_batch
from apps.jobs.models import Job
from apps.jobs.services import do_transition_job
from contract.tiers import STAGE_ORDER

if TYPE_CHECKING:
    from apps.matrix.models import Cell

# Hours each stage takes, (low, high)
STAGE_HOURS: dict[str, tuple[float, float]] = {
    "plan": (0.05, 0.2), "load": (0.4, 2.5), "inventory": (0.2, 0.6), "align": (0.8, 3.5), "serve": (0.2, 0.8),
    "bench": (0.8, 2.5), "env": (0.02, 0.05), "eval": (2.0, 9.0),
}
# outcome -> (stages run, the stage that fails or None); weights below
OUTCOMES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "validated": (tuple(s for s in STAGE_ORDER if s not in ("comm", "soak", "reference", "conformance")), None),  # no seeded collectives, soak, reference or tool conformance (the seeded templates declare no tools)
    "baselined": (("plan", "load", "inventory", "align", "serve", "bench", "env"), None),
    "align-fails": (("plan", "load", "inventory", "align"), "align"),
    "load-fails": (("plan", "load"), "load"),
    "serves": (("plan", "load", "inventory", "serve"), None),
}
OUTCOME_WEIGHTS = {"validated": 3, "baselined": 4, "align-fails": 2, "load-fails": 1, "serves": 1}


class Clock:
    """The simulated time; ``advance`` moves it forward."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now

    def set(self, when: datetime) -> datetime:
        self.now = when
        return when


@contextmanager
def simulated_clock(start: datetime) -> Iterator[Clock]:
    """A ``Clock`` starting at ``start`` for a block of seeding calls (each takes the clock explicitly)."""
    yield Clock(start)


def _stamp(job: Job, clock: Clock, job_fields: tuple[str, ...] = (), *, stage: str | None = None,
           tier_reached_before: dict | None = None) -> None:
    """Gives the rows the last service call wrote for ``job`` the clock's time: ``job_fields`` of the job, and
    with ``stage`` that stage's result (and benchmark run); then recomputes the cell at that time from the tier
    times it had before the call (``tier_reached_before``), so a tier reached now is reached at ``clock.now``."""
    now = clock.now
    fields = dict.fromkeys(("updated_at", *job_fields), now)
    Job.objects.filter(pk=job.pk).update(**fields)
    for name, value in fields.items():
        setattr(job, name, value)
    if stage is not None:
        StageResult.objects.filter(job=job, stage=stage).update(created_at=now)
        if stage == "bench":
            BenchmarkRun.objects.filter(result__job=job).update(created_at=now)
    if tier_reached_before is not None:
        job.model.cells.filter(hardware_id=job.hardware_id, engine__default=True).update(tier_reached_at=tier_reached_before)
    _recompute_cell(job.model_id, job.hardware_id, now=now)


def _recompute_cell(model_id: int, hardware_id: int, *, now: datetime | None = None) -> None:
    """The matrix recomputes the cell (``cell_inputs_changed``), its tier times at the seeded clock's ``now``."""
    events.send_now(events.cell_inputs_changed, model_id=model_id, hardware_id=hardware_id, reason="", history=None,
                    now=now)


def _tier_times(job: Job) -> dict:
    return job.model.cells.filter(hardware_id=job.hardware_id, engine__default=True).values_list(
        "tier_reached_at", flat=True).first() or {}


def _record(job: Job, stage: str, section: dict[str, Any], clock: Clock) -> None:
    """Posts one stage's section through the ingest service, at the clock's time."""
    before = _tier_times(job)
    do_record_job_results(job, {"stage": stage, "section": section, "attempt": job.attempts, "nonce": job.nonce})
    _stamp(job, clock, stage=stage, tier_reached_before=before)


def _transition(job: Job, state: str, clock: Clock, **fields: Any) -> None:
    """A job transition at the clock's time."""
    do_transition_job(job, state, **fields)
    _stamp(job, clock, ("dispatched_at", "started_at") if state == JobState.RUNNING else ("finished_at",))


@dataclass
class PlantedRegression:
    model: str
    hardware: str
    at: datetime
    latency_factor: float
    throughput_factor: float


@dataclass
class SeedSummary:
    jobs: int = 0
    cells: list[tuple[str, str, str]] = field(default_factory=list)  # (model, hardware, outcome)
    history: list[tuple[str, str, int]] = field(default_factory=list)  # (model, hardware, runs)
    regression: PlantedRegression | None = None


def profile_for(model: ModelRelease, hardware: Hardware, cell: Cell | None, dtype: str = "bfloat16") -> sec.CellProfile:
    config = model.config or {}
    layers = int(config.get("num_hidden_layers") or 32)
    kv_heads = int(config.get("num_key_value_heads") or config.get("num_attention_heads") or 8)
    head_dim = int(config.get("head_dim") or (config.get("hidden_size", 4096) // max(config.get("num_attention_heads")
                                                                                        or 32, 1)))
    devices = (cell.fits_devices if cell and cell.fits_devices else None) or max(
        1, -(-model.params_total * 2 * 108 // 100 // int(hardware.memory_bytes * 0.9)))
    return sec.CellProfile(tpot_floor_ms=_tpot_floor(model, hardware, cell, dtype, int(devices)),params_total=model.params_total, params_active=model.params_active, layers=layers,
                           kv_bytes_per_token=2 * layers * kv_heads * head_dim * 2,
                           memory_bytes=hardware.memory_bytes, bandwidth_gbps=hardware.memory_bandwidth_gbps or 1000,
                           devices=int(devices), dtype=dtype,
                           device_bytes=(cell.fits_plan or {}).get("bytes_per_device") if cell else None,
                           context_length=model.context_length,
                           digest_seed=hashlib.sha256(model.slug.encode()).hexdigest())


def _tpot_floor(model: ModelRelease, hardware: Hardware, cell: Cell | None, dtype: str, devices: int) -> float | None:
    """The portal's TPOT floor (ms) for the layout the seeded plan section states, so that seeded benchmarks
    are as physically plausible as the portal requires; None when the config cannot be planned."""
    from contract.verdicts.bench import decode_floor_bytes

    plan = ((cell.fits_plan if cell else None) or {}).get("plan") or {}
    tp, ep = plan.get("tp") or min(devices, 8), plan.get("ep") or 1
    if not model.config or not hardware.memory_bandwidth_gbps:
        return None
    try:
        floor = decode_floor_bytes(model.config, dtype, int(tp), int(ep), 512)
    except Exception:  # a config the planner cannot read: the profile's own estimate stands
        return None
    return floor / (hardware.memory_bandwidth_gbps * 1e9) * 1000


def _job(model: ModelRelease, hardware: Hardware, stages: tuple[str, ...], dtype: str, clock: Clock,
         **bench: Any) -> Job:
    spec = {"stages": list(stages), "dtype": dtype, "tp": None, "ep": None, "thresholds": {},
            "bench": {"concurrency": [1, 4, 16, 64], "input_len": 512, "output_len": 128,
                      "num_prompts": sec.SEEDED_PROMPTS, **bench}, "seeded": True}
    job = Job.objects.create(model=model, hardware=hardware, organization=model.organization, spec=spec,
                             state=JobState.QUEUED)
    Job.objects.filter(pk=job.pk).update(created_at=clock.now)
    job.created_at = clock.now
    return job


class _Events:
    """Numbers and stores a job's events through the ingest service (what an agent's batches become)."""

    def __init__(self, job: Job, clock: Clock) -> None:
        self.job, self.clock, self.seq, self.batch = job, clock, 0, []

    def add(self, stage: str, kind: str, message: str, level: str = "info", data: dict | None = None) -> None:
        self.seq += 1
        self.batch.append({"seq": self.seq, "ts": self.clock.now.isoformat(), "stage": stage, "kind": kind,
                           "level": level, "message": message, "data": data})

    def flush(self) -> None:
        if self.batch:
            do_store_job_events(self.job, parse_event_batch(self.batch, max_events=10_000))
            self.batch = []


def run_adaptation(model: ModelRelease, hardware: Hardware, outcome: str, clock: Clock, rng: random.Random,
                   *, with_events: bool = True) -> Job:
    """One adaptation job, stage by stage at the clock's time: events, results, transitions, cell recompute."""
    stages, failing = OUTCOMES[outcome]
    cell = model.cells.filter(hardware=hardware, engine__default=True).first()
    if cell is not None and cell.fits is False:
        stages, failing = ("plan",), "plan"
    dtype = "bfloat16" if "bfloat16" in (hardware.dtypes or ["bfloat16"]) else "float16"
    profile = profile_for(model, hardware, cell, dtype)
    job = _job(model, hardware, stages, dtype, clock)
    events = _Events(job, clock)
    _transition(job, JobState.RUNNING, clock)
    for stage in stages:
        passed = stage != failing
        events.add(stage, "stage_started", f"{stage} started", data={"stage": stage})
        if with_events and stage in ("load", "inventory", "bench"):
            total = {"load": profile.layers * 9 + 3, "inventory": len(sec.OPS), "bench": 4}[stage]
            for done in (total // 4, total // 2, total):
                events.add(stage, "progress", f"{stage}: {done}/{total}",
                           data={"done": done, "total": total, "what": stage})
        if with_events:
            events.add(stage, "log", f"{stage}: working on {hardware.slug}", level="debug")
        hours = rng.uniform(*STAGE_HOURS[stage])
        clock.advance(hours=hours)
        section = (sec.plan_section(profile, cell.fits_plan if cell else None) if stage == "plan"
                   else _section(stage, profile, hardware, rng, passed))
        if stage == "plan" and failing == "plan":
            section["fits"] = False
        _record(job, stage, section, clock)
        error = None if passed else _failure(stage)
        events.add(stage, "stage_finished", f"{stage} passed" if passed else f"{stage} failed: {error}",
                   level="info" if passed else "error", data={"stage": stage, "passed": passed, "seconds": round(hours * 3600, 1),
                                                              "error": error})
        events.flush()
        if not passed:
            _transition(job, JobState.FAILED, clock, failed_stage=stage, error=error)
            return job
    _transition(job, JobState.SUCCEEDED, clock)
    return job


def _failure(stage: str) -> str:
    return {"plan": "the model does not fit within 16 nodes", "load": "1 tensor failed verification",
            "align": "layer cosine below 0.99 from layer 17 on",
            "serve": "server not ready within 600 s"}.get(stage, f"{stage} failed")


def _section(stage: str, p: sec.CellProfile, hw: Hardware, rng: random.Random, passed: bool) -> dict[str, Any]:
    if stage == "plan":
        return sec.plan_section(p)
    if stage == "load":
        return sec.load_section(p, rng, ok=passed)
    if stage == "inventory":
        return sec.inventory_section(list(hw.operator_manifest or []), rng, missing=rng.choice((0, 0, 1)))
    if stage == "align":
        return sec.align_section(p, rng, passed=passed)
    if stage == "serve":
        return sec.serve_section(rng)
    if stage == "bench":
        return sec.bench_section(p, rng)
    if stage == "env":
        return sec.env_section(hw.name, p.devices, rng)
    return sec.eval_section(rng, passed=passed, context_length=p.context_length)


def run_benchmark_history(model: ModelRelease, hardware: Hardware, clock: Clock, rng: random.Random, *,
                          start: datetime, days: int, regression_day: int | None = None,
                          regression: tuple[float, float] = (1.6, 1.0)) -> list[Job]:
    """One bench-only job a day for ``days`` days from ``start``; on ``regression_day`` (and the day after)
    per-token latency is multiplied by ``regression[0]`` (so throughput drops to about 1/that) and throughput
    further by ``regression[1]``."""
    cell = model.cells.filter(hardware=hardware, engine__default=True).first()
    profile = profile_for(model, hardware, cell)
    jobs = []
    for day in range(days):
        clock.set(start + timedelta(days=day, minutes=rng.randint(0, 90)))
        drift = 1 - 0.08 * day / max(days, 1)  # the runtime gets a little faster over the year
        latency, throughput = drift, 1.0
        if regression_day is not None and regression_day <= day <= regression_day + 1:
            latency, throughput = drift * regression[0], regression[1]
        with transaction.atomic():  # one commit per run, as an agent's result post would be
            job = _job(model, hardware, ("bench",), profile.dtype, clock)
            _transition(job, JobState.RUNNING, clock)
            clock.advance(minutes=rng.uniform(20, 50))
            section = sec.bench_section(profile, rng, sec.BenchShape(latency=latency, throughput=throughput))
            _record(job, "bench", section, clock)
            _transition(job, JobState.SUCCEEDED, clock)
        jobs.append(job)
    return jobs


def seed_evidence(*, models: list[ModelRelease] | None = None, hardware: list[Hardware] | None = None,
                  days: int = 365, history_cells: int = 2, hardware_per_model: int = 5, seed: int = 0,
                  now: datetime | None = None, regression_days_ago: int = 10,
                  outcomes: list[str] | None = None) -> SeedSummary:
    """Adaptation jobs for each released model on up to ``hardware_per_model`` hardware, then ``days`` of
    daily benchmark runs for ``history_cells`` baselined cells, the first with a planted regression
    ``regression_days_ago`` days before ``now``. ``outcomes`` (keys of ``OUTCOMES``) fixes, in order, what
    happens on the first hardware of the list instead of drawing at random."""
    unknown = [o for o in outcomes or [] if o not in OUTCOMES]
    if unknown:
        raise ValueError(f"unknown outcomes {unknown}; known: {', '.join(OUTCOMES)}")
    rng = random.Random(seed)
    now = now or datetime.now(UTC)
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with connection.cursor() as cursor:  # seeded history is reproducible: no need to wait for each fsync
            cursor.execute("SET synchronous_commit TO OFF")
    models = [m for m in (models if models is not None else ModelRelease.objects.all()) if m.released_at]
    hardware = list(hardware if hardware is not None else Hardware.objects.exclude(slug="cpu"))
    summary = SeedSummary()
    hw_speed = {h.pk: rng.uniform(0.3, 3.0) for h in hardware}  # some vendors adapt faster than others
    baselined: list[tuple[ModelRelease, Hardware, datetime]] = []
    clock = Clock(now)
    for model in models:
        if outcomes:
            chosen, planned = hardware[:len(outcomes)], list(outcomes)
        else:
            chosen = rng.sample(hardware, min(hardware_per_model, len(hardware)))
            planned = rng.choices(list(OUTCOME_WEIGHTS), weights=list(OUTCOME_WEIGHTS.values()), k=len(chosen))
        for hw, outcome in zip(chosen, planned, strict=False):
            start = model.released_at + timedelta(hours=rng.uniform(-6, 20) * hw_speed[hw.pk])
            if start > now - timedelta(days=1):
                continue  # not released long enough ago to have a history
            clock.set(start)
            with transaction.atomic():
                job = run_adaptation(model, hw, outcome, clock, rng)
            summary.jobs += 1
            summary.cells.append((model.slug, hw.slug, outcome if job.state == JobState.SUCCEEDED
                                  else f"failed at {job.failed_stage}"))
            if job.state == JobState.SUCCEEDED and "bench" in job.stages:
                baselined.append((model, hw, clock.now))
    for i, (model, hw, finished) in enumerate(baselined[:history_cells]):
        earliest = max(finished + timedelta(days=1), now - timedelta(days=days))
        start = earliest.replace(hour=2, minute=0, second=0, microsecond=0)  # the daily runs start at 02:00
        if start > earliest:  # seeded before 02:00: that day's run is the day before, else one day is lost
            start -= timedelta(days=1)
        count = max((now - start).days, 0)
        regression_day = count - regression_days_ago if i == 0 and count > regression_days_ago + 15 else None
        jobs = run_benchmark_history(model, hw, clock, rng, start=start, days=count,
                                     regression_day=regression_day)
        summary.jobs += len(jobs)
        summary.history.append((model.slug, hw.slug, len(jobs)))
        if regression_day is not None:
            run = jobs[regression_day].stage_results.get(stage="bench").benchmark
            summary.regression = PlantedRegression(model.slug, hw.slug, run.created_at, 1.6, round(1 / 1.6, 3))
    return summary


def delete_seeded_jobs() -> int:
    """Deletes every seeded job (and so its evidence) and recomputes the cells they were in."""
    cells = set(Job.objects.filter(spec__seeded=True).values_list("model_id", "hardware_id").distinct())
    deleted, _ = Job.objects.filter(spec__seeded=True).delete()
    for model_id, hardware_id in cells:
        _recompute_cell(model_id, hardware_id)
    return deleted
