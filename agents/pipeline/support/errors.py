"""The two ways a stage ends early: ``StageFailed`` (no passing evidence; the message goes to the report's
``error``) and ``JobCancelled`` (the job was cancelled between steps)."""

from __future__ import annotations

from typing import Protocol


class StageFailed(Exception):
    """A stage could not produce passing evidence; the message goes to the report's ``error``."""


class JobCancelled(Exception):
    """Raised between steps when the job was cancelled."""


class Cancellable(Protocol):
    """What a long wait polls between steps (a ``StageContext``)."""

    def check_cancelled(self) -> None: ...
