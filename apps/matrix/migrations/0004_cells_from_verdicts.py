"""Recomputes every cell's tier from the verdicts of ``evidence.0004`` (before, tiers rested on the agents'
own pass flags), keeps when each tier was first reached (made monotone), and records each stage's newest
verdict on the cell. Failed-at and lead times are left as they are until the cell's next recompute."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import migrations


def recompute(apps: Any, schema_editor: Any) -> None:
    from apps.matrix.migrations._frozen_0004 import TIER_GATES, compute_tier, tier_times

    Cell = apps.get_model("matrix", "Cell")
    StageResult = apps.get_model("evidence", "StageResult")
    for cell in Cell.objects.iterator(chunk_size=500):
        newest: dict[str, Any] = {}
        for result in (StageResult.objects.filter(job__model_id=cell.model_id, job__hardware_id=cell.hardware_id)
                       .order_by("stage", "-created_at", "-id").defer("section")):
            newest.setdefault(result.stage, result)
        if not newest and not cell.tier:
            continue
        flags = {stage: r.verdict == "pass" for stage, r in newest.items()}
        tier = compute_tier(flags)
        times = {stage: r.created_at for stage, r in newest.items()}
        reached = tier_times(dict(cell.tier_reached_at or {}), tier, times, cell.updated_at)
        gates = [newest[stage] for level, stage in TIER_GATES if level <= tier]
        cell.tier, cell.stage_passed, cell.tier_reached_at = tier, flags, reached
        cell.current_tier_reached_at = datetime.fromisoformat(reached[str(tier)]) if tier else None
        cell.verdicts = {stage: {"status": r.verdict, "reasons": r.reasons, "claimed": r.claimed_passed,
                                 "disputed": r.claimed_passed is not None and r.claimed_passed != (r.verdict == "pass"),
                                 "job": r.job_id, "at": r.created_at.isoformat(),
                                 "defaults_version": r.defaults_version, "custom_thresholds": r.custom_thresholds,
                                 "synthetic": r.synthetic} for stage, r in sorted(newest.items())}
        cell.disputed = sorted(stage for stage, v in cell.verdicts.items() if v["disputed"])
        cell.custom_thresholds = any(r.custom_thresholds for r in gates)
        cell.synthetic = any(r.synthetic for r in gates)
        cell.save(update_fields=["tier", "stage_passed", "tier_reached_at", "current_tier_reached_at", "verdicts",
                                 "disputed", "custom_thresholds", "synthetic"])


class Migration(migrations.Migration):
    dependencies = [("matrix", "0003_cell_verdicts"), ("evidence", "0004_rejudge_stored_results")]

    operations = [migrations.RunPython(recompute, migrations.RunPython.noop)]
