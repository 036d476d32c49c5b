"""The ``env`` stage: lock the environment the evidence was produced in — runtime commit, torch, Python,
driver and toolkit, device name and count, dispatch key, CPU model — so a result can be reproduced."""

from __future__ import annotations

from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.environment import environment_lock
from agents.pipeline.support.errors import StageFailed


def run(ctx: StageContext) -> dict[str, Any]:
    """The ``env`` stage."""
    try:
        return environment_lock(ctx.device)
    except ValueError as exc:
        raise StageFailed(str(exc)) from exc
