"""The only writer of ``Cell``: fits estimates from configs, tiers from evidence."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.catalog.engines import default_engine, engine_for_spec, engine_jobs_q
from apps.catalog.models import Engine, Hardware, ModelRelease
from apps.core import events
from apps.evidence.judging_facts import reference_declares_tools
from apps.evidence.models import StageResult
from apps.evidence.selectors import cell_results
from apps.jobs.choices import JobPurpose
from apps.jobs.models import Job
from apps.matrix.events import CellChangedMessage, broadcast_cell_changed, broadcast_matrix_changed
from apps.matrix.grid_cache import matrix_changed
from apps.matrix.history import failure_label, open_failure, record_history
from apps.matrix.models import Cell, CellHistory
from apps.matrix.selectors import lead_hours
from apps.matrix.series import version_regression
from contract.engines import DEFAULT_ENGINE
from contract.tiers import TIER_GATES, TIER_NAMES, compute_tier
from contract.verdicts import PASS

logger = logging.getLogger(__name__)

FIT_FIELDS = ("fits", "fits_devices", "fits_plan", "fits_error")


def estimate_fit(model: ModelRelease, hardware: Hardware, dtype: str = "auto") -> dict[str, Any]:
    """The fits estimate of a cell from the config alone, via ``contract.planner.plan_report``; by default
    in the checkpoint's own format (``"auto"``: FP8, MXFP4, bf16 …), recorded as ``fits_plan["dtype"]``."""
    try:
        from contract.planner import plan_report
    except ImportError as exc:
        return {"fits": None, "fits_devices": None, "fits_plan": {}, "fits_error": f"planner unavailable: {exc}"}
    try:
        report = plan_report(
            model.config,
            memory_bytes=hardware.memory_bytes,
            devices_per_node=hardware.devices_per_node,
            dtype=dtype,
            shared_memory=hardware.shared_memory,
            hardware_dtypes=list(hardware.dtypes or []),
        )
    except Exception as exc:  # a config the planner cannot plan is shown on the cell, never a crash
        return {"fits": None, "fits_devices": None, "fits_plan": {}, "fits_error": f"{type(exc).__name__}: {exc}"}
    summary = {k: v for k, v in report.items() if k not in ("candidates", "spec")}
    plan = report.get("plan") or {}
    fits = bool(report.get("fits"))
    return {
        "fits": fits,
        "fits_devices": plan.get("devices") if fits else None,
        "fits_plan": summary,
        "fits_error": "",
    }


def refresh_cells(*, models: Iterable[ModelRelease] | None = None,
                  hardware: Iterable[Hardware] | None = None) -> int:
    """Creates the missing cells of the given models (all hardware) or hardware (all models) and recomputes
    their fits estimates. Returns the number of cells refreshed."""
    model_list = list(models) if models is not None else list(ModelRelease.objects.all())
    hardware_list = list(hardware) if hardware is not None else list(Hardware.objects.all())
    if not model_list or not hardware_list:
        return 0
    engine = default_engine()  # every model × hardware has the bundled runtime's cell; others come with evidence
    Cell.objects.bulk_create(
        [Cell(model=m, hardware=h, engine=engine) for m in model_list for h in hardware_list], ignore_conflicts=True
    )
    cells = {
        (c.model_id, c.hardware_id): c
        for c in Cell.objects.filter(model__in=model_list, hardware__in=hardware_list, engine=engine)
    }
    changed = []
    for m in model_list:
        for h in hardware_list:
            cell = cells[(m.pk, h.pk)]
            for name, value in estimate_fit(m, h).items():
                setattr(cell, name, value)
            changed.append(cell)
    Cell.objects.bulk_update(changed, FIT_FIELDS, batch_size=500)
    matrix_changed()
    model_id = model_list[0].pk if len(model_list) == 1 else None
    hardware_id = hardware_list[0].pk if len(hardware_list) == 1 else None
    transaction.on_commit(lambda: broadcast_matrix_changed(model_id=model_id, hardware_id=hardware_id))
    return len(changed)


def refresh_lead_times(model: ModelRelease) -> None:
    """Recomputes the stored lead times of a model's cells, every engine's (its release time changed)."""
    cells = list(Cell.objects.filter(model=model, current_tier_reached_at__isnull=False))
    for cell in cells:
        cell.lead_hours = lead_hours(cell.current_tier_reached_at, model.released_at)
    Cell.objects.bulk_update(cells, ["lead_hours"])
    matrix_changed()


def cell_engines(model_id: int, hardware_id: int) -> list[Engine]:
    """The engines whose cells a model × hardware has: the default one, every engine its certify jobs named and
    every engine a cell already exists for (three queries)."""
    named = set(Job.objects.filter(model_id=model_id, hardware_id=hardware_id, purpose=JobPurpose.CERTIFY)
                .values_list("spec__engine__name", "spec__engine__version").distinct())
    engines = {default_engine()}
    for name, version in named:
        if name and name != DEFAULT_ENGINE:
            engines.add(engine_for_spec({"engine": {"name": name, "version": version or ""}}))
    for cell in Cell.objects.filter(model_id=model_id, hardware_id=hardware_id).select_related("engine"):
        engines.add(cell.engine)
    return sorted(engines, key=lambda e: (not e.default, e.name, e.version))


def _newest_verdicts(model_id: int, hardware_id: int, engine: Engine) -> dict[str, StageResult]:
    """stage -> its newest result in this cell (``engine``'s jobs; with the verdict, the claim and when it
    arrived)."""
    newest: dict[str, int] = {}
    for pk, stage in (cell_results(model_id, hardware_id).filter(engine_jobs_q(engine, "job__"))
                      .order_by("stage", "-created_at", "-id").values_list("id", "stage")):
        newest.setdefault(stage, pk)
    rows = StageResult.objects.filter(pk__in=list(newest.values())).defer("section")
    return {r.stage: r for r in rows}


def _declares_tools(newest: dict[str, StageResult], model_id: int) -> bool:
    """Whether the cell's model template declares tools (tier 3 then needs a passing conformance:
    ``contract.tiers.compute_tier``): as the release's reference run found it, else as this cell's newest serve
    or conformance section did."""
    known = reference_declares_tools(model_id)
    if known is not None:
        return known
    ids = [newest[s].pk for s in ("serve", "conformance") if s in newest]
    found = StageResult.objects.filter(pk__in=ids).values_list("section__template_declares_tools", flat=True)
    return any(value is True for value in found)


def _verdict_summary(result: StageResult) -> dict[str, Any]:
    return {"status": result.verdict, "reasons": result.reasons, "claimed": result.claimed_passed,
            "disputed": result.disputed, "job": result.job_id, "at": result.created_at.isoformat(),
            "defaults_version": result.defaults_version, "custom_thresholds": result.custom_thresholds,
            "synthetic": result.synthetic}


def tier_times(reached: dict[str, str], tier: int, times: dict[str, datetime], now: datetime) -> dict[str, str]:
    """The first time each tier up to ``tier`` was reached, kept monotone: a tier is reached no earlier than
    its own gate's evidence, nor than any tier below it (whatever order the stages arrived in). The times of
    tiers above ``tier`` are dropped: after a tier drop, reaching a tier again is a new first time."""
    out = {level: at for level, at in reached.items() if int(level) <= tier}
    floor: datetime | None = None
    for level, stage in TIER_GATES:
        known = out.get(str(level))
        if known is None:
            if level > tier:
                break
            at = times.get(stage) or now
        else:
            at = datetime.fromisoformat(known)
        if floor is not None and at < floor:
            at = floor
        out[str(level)] = at.isoformat()
        floor = at
    return out


@transaction.atomic
def recompute_cell(model_id: int, hardware_id: int, *, engine: Engine | None = None, now: datetime | None = None,
                   reason: str = "", history: dict[str, Any] | None = None) -> Cell:
    """Recomputes the cell of ``engine`` (default: the bundled runtime), from its jobs' evidence only: its tier from the portal's verdicts on the newest evidence of each stage (never the
    agent's claimed flags), its "failed at" (below; else the first gate above the tier whose newest verdict
    refuses it, with the reasons), whether the tier rests on custom thresholds or
    synthetic evidence, and the first time each tier was reached (monotone; ``now`` is the time of a tier
    reached without evidence time, default the clock's; a drop clears the times above the new tier).

    "Failed at" is the newest failed, lost or cancelled job that no newer job proved wrong
    (``history.open_failure``). A tier change is a ``CellHistory`` entry with ``reason``; ``history``
    (``{"kind", "data"}``) records an entry even when the tier stays (a re-judging). Broadcasts after commit."""
    engine = engine or default_engine()
    Cell.objects.bulk_create([Cell(model_id=model_id, hardware_id=hardware_id, engine=engine)], ignore_conflicts=True)
    cell = Cell.objects.select_for_update().select_related("model", "hardware", "engine").get(
        model_id=model_id, hardware_id=hardware_id, engine=engine
    )
    before = (cell.tier, cell.failed_stage, cell.error, list(cell.disputed or []), cell.custom_thresholds,
              cell.synthetic)
    newest = _newest_verdicts(model_id, hardware_id, engine)
    flags = {stage: r.verdict == PASS for stage, r in newest.items()}
    times = {stage: r.created_at for stage, r in newest.items()}
    declares_tools = _declares_tools(newest, model_id)
    tier = compute_tier(flags, template_declares_tools=declares_tools)
    now = now or timezone.now()
    reached = tier_times(dict(cell.tier_reached_at or {}), tier, times, now)
    gates = [newest[stage] for level, stage in TIER_GATES if level <= tier]
    cell.verdicts = {stage: _verdict_summary(r) for stage, r in sorted(newest.items())}
    cell.disputed = sorted(stage for stage, r in newest.items() if r.disputed)
    cell.custom_thresholds = any(r.custom_thresholds for r in gates)
    cell.synthetic = any(r.synthetic for r in gates)
    jobs = Job.objects.filter(engine_jobs_q(engine), model_id=model_id, hardware_id=hardware_id,
                              purpose=JobPurpose.CERTIFY)
    cell.tier = tier
    cell.stage_passed = flags
    cell.tier_reached_at = reached
    cell.current_tier_reached_at = datetime.fromisoformat(reached[str(tier)]) if tier else None
    cell.lead_hours = lead_hours(cell.current_tier_reached_at, cell.model.released_at)
    next_gate = next((stage for level, stage in TIER_GATES if level == tier + 1), None)
    refused = newest.get(next_gate) if next_gate else None
    if next_gate == "serve" and declares_tools and refused is not None and refused.verdict == PASS:
        refused = newest.get("conformance")  # serve passed: tier 3 waits on the conformance verdict
    failure = open_failure(model_id, hardware_id, engine)
    if failure is not None:
        cell.failed_stage = failure_label(failure)[:32]
        cell.error = failure.error
    elif refused is not None and refused.verdict != PASS:  # the agent may think it passed: the portal says why not
        cell.failed_stage = refused.stage
        cell.error = "; ".join(refused.reasons)[:10_000]
    else:
        cell.failed_stage, cell.error = "", ""
    cell.last_job = jobs.order_by("-created_at", "-id").first()
    cell.job_count = jobs.count()
    cell.save()  # post_save: matrix_changed (the rendered grids are stale)
    if history is not None:
        record_history(cell, kind=history.get("kind", CellHistory.Kind.REJUDGE), tier_before=before[0],
                       reason=reason or "re-judged", data=history.get("data"))
    elif cell.tier != before[0]:
        record_history(cell, kind=CellHistory.Kind.TIER, tier_before=before[0],
                       reason=reason or "recomputed from the newest evidence")
    if (cell.tier, cell.failed_stage, cell.error, cell.disputed, cell.custom_thresholds, cell.synthetic) != before:
        message = CellChangedMessage(
            type="cell.changed", model=cell.model.slug, hardware=cell.hardware.slug, tier=cell.tier,
            tier_name=TIER_NAMES[cell.tier], failed_stage=cell.failed_stage, fits=cell.fits,
            fits_devices=cell.fits_devices, custom_thresholds=cell.custom_thresholds, synthetic=cell.synthetic,
            disputed=list(cell.disputed), engine=engine.ref,
        )
        transaction.on_commit(lambda: broadcast_cell_changed(message))
    if cell.tier < before[0]:
        events.publish(events.tier_dropped, cell_id=cell.pk, model_id=cell.model_id, hardware_id=cell.hardware_id,
                       from_tier=before[0], to_tier=cell.tier, failed_stage=cell.failed_stage, error=cell.error,
                       job_id=cell.last_job_id, engine=engine.ref)
    version_regression(cell, before[0])
    return cell
