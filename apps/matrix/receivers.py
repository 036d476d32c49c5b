"""The matrix follows the facts it is computed from (``apps.core.events``, sent inside the writer's transaction so
a cell commits or rolls back with them): a job's creation or state and new or re-judged results recompute the
cell's tier; a release or hardware created or updated refreshes the fits of its row or column (a new release
date: the lead times; a change that leaves the cells as they were: a broadcast so pages re-read the matrix); a
stack change of a hardware pool queues its re-validation jobs (``stacks``).
Connected in ``MatrixConfig.ready``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from apps.core import events
from apps.matrix import services, stacks
from apps.matrix.events import broadcast_matrix_changed


def on_cell_inputs_changed(*, model_id: int, hardware_id: int, reason: str = "", history: dict[str, Any] | None = None,
                           now: datetime | None = None, **_: Any) -> None:
    """Recomputes the cell of every engine the model × hardware's jobs ran (the bundled runtime's always): each
    keeps to its own jobs' evidence, so recomputing one that did not change leaves it as it was."""
    for engine in services.cell_engines(model_id, hardware_id):
        services.recompute_cell(model_id, hardware_id, engine=engine, reason=reason, history=history, now=now)


def on_catalog_changed(*, model: Any = None, hardware: Any = None, created: bool = False, changed: Any = (),
                       **_: Any) -> None:
    if hardware is not None:
        services.refresh_cells(hardware=[hardware])
    if model is None:
        return
    if "released_at" in changed:
        services.refresh_lead_times(model)
    if created or "config" in changed:
        services.refresh_cells(models=[model])
    else:  # visibility or release date may change what the matrix shows; cells themselves are unchanged
        model_id = model.pk
        transaction.on_commit(lambda: broadcast_matrix_changed(model_id=model_id))


def connect() -> None:
    events.stack_change_recorded.connect(stacks.on_stack_change_recorded, dispatch_uid="matrix.stack_change_recorded")
    events.cell_inputs_changed.connect(on_cell_inputs_changed, dispatch_uid="matrix.cell_inputs_changed")
    events.catalog_changed.connect(on_catalog_changed, dispatch_uid="matrix.catalog_changed")
