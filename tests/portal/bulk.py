"""Builds a large synthetic matrix fast (bulk inserts), for the query-count tests and benchmarks/portal_matrix.py.

Rows are real (ModelRelease with a real config and computed fields, cells, jobs, stage results), only the
amounts are synthetic."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from apps.accounts.models import Organization
from apps.catalog.engines import default_engine
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.services import model_fields_from_config
from apps.evidence.models import StageResult
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from apps.matrix.grid_cache import matrix_changed
from apps.matrix.models import Cell
from tests.factories import tiny_config

VENDORS = ("NVIDIA", "AMD", "Intel", "Google", "Huawei")


def build_matrix(n_models: int, n_hardware: int, jobs_per_cell: int, *, seed: int = 0, tag: str = "b") -> None:
    rng = random.Random(seed)
    org, _ = Organization.objects.get_or_create(slug=f"bulk-{tag}", defaults={"name": "Bulk"})
    config = tiny_config()
    derived = model_fields_from_config(config)
    base = datetime(2025, 1, 1, tzinfo=UTC)
    hardware = Hardware.objects.bulk_create([
        Hardware(slug=f"{tag}-hw-{i}", vendor=VENDORS[i % len(VENDORS)], name=f"Accelerator {i}",
                 memory_bytes=(16 + 8 * (i % 20)) * 10**9, devices_per_node=8, dtypes=["bfloat16", "float32"],
                 peak_tflops={"bfloat16": 400.0})
        for i in range(n_hardware)
    ])
    models = ModelRelease.objects.bulk_create([
        ModelRelease(slug=f"{tag}-model-{i}", name=f"Model {i}", organization=org, config=config,
                     released_at=base + timedelta(days=i), visibility="public", **derived)
        for i in range(n_models)
    ])
    cells = []
    engine = default_engine()
    for m in models:
        for h in hardware:
            tier = rng.randint(0, 6)
            reached = m.released_at + timedelta(hours=rng.randint(1, 400))
            cells.append(Cell(model=m, hardware=h, engine=engine, tier=tier, fits=True, fits_devices=rng.choice([1, 2, 4, 8]),
                              fits_plan={"plan": {"tp": 1, "pp": 1, "ep": 1, "devices": 1}},
                              failed_stage=rng.choice(["", "", "", "align", "serve"]),
                              tier_reached_at={str(t): reached.isoformat() for t in range(1, tier + 1)},
                              current_tier_reached_at=reached if tier else None,
                              lead_hours=round((reached - m.released_at).total_seconds() / 3600, 1) if tier else None,
                              job_count=jobs_per_cell))
    Cell.objects.bulk_create(cells, batch_size=2000)
    matrix_changed()  # bulk inserts send no signal: the portal's writers call this too
    if not jobs_per_cell:
        return
    jobs = [Job(model=m, hardware=h, organization=org, spec={"stages": ["plan"]}, state=JobState.SUCCEEDED,
                attempts=1) for m in models for h in hardware for _ in range(jobs_per_cell)]
    jobs = Job.objects.bulk_create(jobs, batch_size=5000)
    StageResult.objects.bulk_create(
        [StageResult(job=j, stage="plan", passed=True, section={"fits": True}) for j in jobs], batch_size=5000)
