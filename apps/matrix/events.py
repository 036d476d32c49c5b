"""Matrix change notifications to the Channels group ``matrix`` (consumed by ``/ws/matrix/``).

Producers call only ``broadcast_matrix_changed``, after their transaction commits."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from apps.core.broadcast import group_send

MATRIX_GROUP = "matrix"


class CellChangedMessage(TypedDict):
    type: Literal["cell.changed"]
    model: str
    hardware: str
    tier: int
    tier_name: str
    failed_stage: str
    fits: bool | None
    fits_devices: int | None
    custom_thresholds: bool
    synthetic: bool
    disputed: list[str]
    engine: NotRequired[str]  # the cell's engine, NAME@VERSION (the page updates in place only the engine it shows)


class MatrixChangedMessage(TypedDict):
    type: Literal["matrix.changed"]
    model_id: int | None
    hardware_id: int | None


def _send(message: CellChangedMessage | MatrixChangedMessage) -> None:
    group_send(MATRIX_GROUP, dict(message))


def broadcast_cell_changed(message: CellChangedMessage) -> None:
    _send(message)


def broadcast_matrix_changed(*, model_id: int | None = None, hardware_id: int | None = None) -> None:
    _send(MatrixChangedMessage(type="matrix.changed", model_id=model_id, hardware_id=hardware_id))
