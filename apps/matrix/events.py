"""Matrix change notifications to the Channels group ``matrix`` (consumed by ``/ws/matrix/``).

Producers call only ``broadcast_matrix_changed``, after their transaction commits."""

from __future__ import annotations

import logging
from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

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


class MatrixChangedMessage(TypedDict):
    type: Literal["matrix.changed"]
    model_id: int | None
    hardware_id: int | None


def _send(message: CellChangedMessage | MatrixChangedMessage) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(MATRIX_GROUP, message)
    except Exception:  # the change is stored; a lost notification must not fail the request
        logger.exception("broadcast to %s failed", MATRIX_GROUP)


def broadcast_cell_changed(message: CellChangedMessage) -> None:
    _send(message)


def broadcast_matrix_changed(*, model_id: int | None = None, hardware_id: int | None = None) -> None:
    _send(MatrixChangedMessage(type="matrix.changed", model_id=model_id, hardware_id=hardware_id))
