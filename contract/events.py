"""The bounds of a job's event log, on both sides: the agent's spool (``agents.worker.spool``) keeps to them and
the portal (``apps.jobs.eventlog``) refuses a batch that does not, naming the event and the key."""

from __future__ import annotations

from collections.abc import Iterable

from contract.tiers import STAGE_ORDER

EVENT_MESSAGE_MAX = 100_000  # characters of one event's message (a job's error is bounded the same)
EVENT_NAME_MAX = 32  # characters of an event's kind and stage
# an event's kind names what it is (log, progress, stage_started …): letters, digits, "_", "-" and "."
KIND_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
# a job's failed stage: one of its stages, or the agent itself (it failed outside the pipeline)
AGENT_FAILURE = "agent"


def event_stages(requested: Iterable[str]) -> frozenset[str]:
    """The stages a job's events may name: "" (the job as a whole), the stages it asked for (every stage when
    it names none, as the results endpoint takes them), and ``conformance`` beside ``serve`` (the pipeline adds it
    when the model's chat template declares tools)."""
    stages = set(requested) or set(STAGE_ORDER)
    if "serve" in stages:
        stages.add("conformance")
    return frozenset({"", *stages})


def failed_stage_problem(value: str, requested: Iterable[str] | None = None) -> str | None:
    """Why ``value`` is not a failed stage a job may report (None when it is): "" (none), ``agent``, or a stage
    name; given the job's ``requested`` stages, one of its own (``event_stages``): a job cannot fail at a stage
    it never ran."""
    if value in ("", AGENT_FAILURE):
        return None
    shown = value if len(value) <= 40 else value[:40] + "…"
    if value not in STAGE_ORDER:
        return f"{shown!r} is not a stage; a failed stage is one of {', '.join(STAGE_ORDER)} or {AGENT_FAILURE!r}"
    if requested is not None and value not in (own := event_stages(requested)):
        return (f"{shown!r} is not a stage of the job (its stages: {', '.join(s for s in STAGE_ORDER if s in own)}; "
                f"or {AGENT_FAILURE!r})")
    return None
