"""Judges every stored stage result with the portal's verdict rules (as they were then: ``_frozen_0004``): before
0003 a result's ``passed`` was the agent's own flag. The flag is kept as ``claimed_passed``; nothing else
changes. Cells take the new verdicts on their next recompute (``manage.py recompute_cells``)."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def rejudge(apps: Any, schema_editor: Any) -> None:
    from apps.evidence.migrations._frozen_0004.base import Context, HardwareFacts, ModelFacts, claimed
    from apps.evidence.migrations._frozen_0004.rules import judge

    StageResult = apps.get_model("evidence", "StageResult")
    for result in StageResult.objects.select_related("job__model", "job__hardware").iterator(chunk_size=500):
        job, model, hardware = result.job, result.job.model, result.job.hardware
        context = Context(
            model=ModelFacts(config=model.config, takes_images="image" in (model.modalities or []),
                             context_length=model.context_length),
            hardware=HardwareFacts(memory_bytes=hardware.memory_bytes, devices_per_node=hardware.devices_per_node,
                                   shared_memory=hardware.shared_memory, dtypes=tuple(hardware.dtypes or ())),
            dtype=(job.spec or {}).get("dtype") or "auto",
        )
        overrides = (job.spec or {}).get("thresholds") or {}
        verdict = judge(result.stage, result.section, overrides, context)
        result.claimed_passed = claimed(result.stage, result.section)
        result.verdict, result.passed = verdict.status, verdict.passed
        result.reasons, result.verdict_notes = verdict.reasons, verdict.notes
        result.defaults_version, result.custom_thresholds = verdict.defaults_version, verdict.custom_thresholds
        result.synthetic = bool((job.spec or {}).get("seeded"))
        result.save(update_fields=["claimed_passed", "verdict", "passed", "reasons", "verdict_notes",
                                   "defaults_version", "custom_thresholds", "synthetic"])


class Migration(migrations.Migration):
    dependencies = [("evidence", "0003_stageresult_verdict"), ("catalog", "0003_release_manifest"),
                    ("jobs", "0002_events_max_seq")]

    operations = [migrations.RunPython(rejudge, migrations.RunPython.noop)]
