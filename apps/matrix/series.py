"""Series across engine versions: the cells of one model × hardware served by the same engine at different
catalog versions, in version order. A version whose settled tier is below the previous version's is a
regression: the ``tier_dropped`` event (the alerts' tier-drop kind) fires once per version and tier, naming both
versions and the stages that passed on the previous version and no longer do; the cell's history keeps it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.catalog.engines import version_key
from apps.core import events
from apps.jobs.choices import JobState
from apps.matrix.history import record_history
from apps.matrix.models import Cell, CellHistory
from contract.tiers import TIER_NAMES
from contract.verdicts import PASS

SETTLED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST)


@dataclass
class EngineCell:
    """One engine's cell of a model × hardware, as the cell page, the API and the compare page list them."""

    ref: str
    name: str
    version: str
    default: bool
    tier: int
    failed_stage: str
    jobs: int
    verdicts: dict[str, Any] = field(default_factory=dict)
    previous: str = ""  # the previous version of the same engine with evidence, when there is one
    previous_tier: int | None = None

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]

    @property
    def regressed(self) -> bool:
        return self.previous_tier is not None and self.tier < self.previous_tier

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.ref, "name": self.name, "version": self.version, "default": self.default,
                "tier": self.tier, "tier_name": self.tier_name, "failed_stage": self.failed_stage or None,
                "jobs": self.jobs, "previous_version": self.previous or None, "previous_tier": self.previous_tier,
                "regressed": self.regressed}


def best_first(rows: list[EngineCell]) -> list[EngineCell]:
    """The highest tier first; on a tie the default engine, then by name and the newest version."""
    by_version = sorted(rows, key=lambda r: version_key(r.version), reverse=True)
    return sorted(by_version, key=lambda r: (-r.tier, not r.default, r.name))


def engine_cells(model_id: int, hardware_id: int) -> list[EngineCell]:
    """Every engine's cell of a model × hardware, best first, each with the previous version of its engine that
    has evidence (one query)."""
    rows = [EngineCell(ref=f"{n}@{v}" if v else n, name=n, version=v, default=d, tier=t, failed_stage=f, jobs=j,
                       verdicts=vd or {})
            for n, v, d, t, f, j, vd in Cell.objects.filter(model_id=model_id, hardware_id=hardware_id)
            .values_list("engine__name", "engine__version", "engine__default", "tier", "failed_stage", "job_count",
                         "verdicts")]
    by_name: dict[str, list[EngineCell]] = {}
    for row in rows:
        by_name.setdefault(row.name, []).append(row)
    for versions in by_name.values():
        versions.sort(key=lambda r: version_key(r.version))
        seen: EngineCell | None = None
        for row in versions:
            if seen is not None:
                row.previous, row.previous_tier = seen.ref, seen.tier
            if row.jobs:
                seen = row
    return best_first(rows)


def previous_version(cell: Cell) -> Cell | None:
    """The cell of the same model × hardware and engine name at the newest version before ``cell``'s that has
    evidence (a job)."""
    mine = version_key(cell.engine.version)
    older = [c for c in Cell.objects.filter(model_id=cell.model_id, hardware_id=cell.hardware_id,
                                            engine__name=cell.engine.name, job_count__gt=0)
             .exclude(pk=cell.pk).select_related("engine") if version_key(c.engine.version) < mine]
    return max(older, key=lambda c: version_key(c.engine.version), default=None)


def lost_stages(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[str]]:
    """stage -> [its verdict on the previous version, on this one] for each stage that passed before and not now."""
    return {stage: [PASS, (after.get(stage) or {}).get("status") or "missing"]
            for stage, v in sorted((before or {}).items())
            if (v or {}).get("status") == PASS and ((after.get(stage) or {}).get("status") != PASS)}


def version_regression(cell: Cell, tier_before: int) -> bool:
    """After ``cell`` was recomputed: when its newest job has settled and its tier is below the previous version's
    of the same engine, publishes ``tier_dropped`` (from the previous version's tier to this one's) and records it
    in the cell's history, once per previous version and tier. Returns whether it fired."""
    if not cell.engine.version or cell.last_job_id is None or cell.last_job.state not in SETTLED:
        return False
    previous = previous_version(cell)
    if previous is None or cell.tier >= previous.tier:
        return False
    if CellHistory.objects.filter(cell=cell, tier_after=cell.tier,
                                  data__version_regression__against=previous.engine.ref).exists():
        return False
    lost = lost_stages(previous.verdicts, cell.verdicts)
    what = ", ".join(f"{stage} {was} → {now}" for stage, (was, now) in lost.items())
    reason = (f"{cell.engine.ref} reaches tier {cell.tier} ({TIER_NAMES[cell.tier]}) where {previous.engine.ref} "
              f"reached {previous.tier} ({TIER_NAMES[previous.tier]})" + (f": {what}" if what else ""))
    record_history(cell, kind=CellHistory.Kind.TIER, tier_before=tier_before, reason=reason,
                   data={"version_regression": {"against": previous.engine.ref, "tier": previous.tier,
                                                "stages": lost}})
    events.publish(events.tier_dropped, cell_id=cell.pk, model_id=cell.model_id, hardware_id=cell.hardware_id,
                   from_tier=previous.tier, to_tier=cell.tier, failed_stage=cell.failed_stage, error=cell.error,
                   job_id=cell.last_job_id, engine=cell.engine.ref, previous_engine=previous.engine.ref,
                   stages=lost)
    return True
