from __future__ import annotations

from datetime import timedelta

from django.db import models

# An agent whose last heartbeat is older than this is offline: shown so, and given no multi-node job's node.
ONLINE_WINDOW = timedelta(seconds=90)


class JobPurpose(models.TextChoices):
    CERTIFY = "certify", "certify"
    REFERENCE = "reference", "reference"


class JobState(models.TextChoices):
    QUEUED = "queued", "queued"
    DISPATCHED = "dispatched", "dispatched"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    LOST = "lost", "lost"


# The only transitions services.do_transition_job accepts. Moving back to queued is a retry (attempts grows on
# the next dispatch).
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    JobState.QUEUED: frozenset({JobState.DISPATCHED, JobState.RUNNING, JobState.CANCELLED, JobState.FAILED,
                                JobState.LOST}),
    JobState.DISPATCHED: frozenset({JobState.RUNNING, JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED,
                                    JobState.CANCELLED, JobState.LOST}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST,
                                 JobState.QUEUED}),
    JobState.LOST: frozenset({JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
ACTIVE_STATES: frozenset[str] = frozenset({JobState.QUEUED, JobState.DISPATCHED, JobState.RUNNING})
FINISHED_STATES: frozenset[str] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})


class EventLevel(models.TextChoices):
    DEBUG = "debug", "debug"
    INFO = "info", "info"
    WARNING = "warning", "warning"
    ERROR = "error", "error"
