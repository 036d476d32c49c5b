"""Domain events: facts one app records that other apps react to, so the app that owns a fact never imports the
apps that react to it (the alerts app, the matrix). Each event is a Django signal with named keyword facts;
receivers connect in their app's ``AppConfig.ready``.

Two ways to send, by what the reaction is:

- ``publish`` (after commit): a reaction outside the fact's own transaction, which must not run for a write that
  rolls back and must not fail the writer: alerts to subscribers. Facts are values (ids, states, messages), not
  rows, because the row may have moved on by the time the transaction commits (a lost job is re-queued in the
  same transaction). A receiver's error is logged, never raised to the publisher.
- ``send_now`` (inside the transaction): a write that must commit or roll back with the fact, such as the
  matrix's cell, which follows its jobs and evidence in the same transaction. A receiver's error propagates.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger(__name__)

# --- published after commit ---------------------------------------------------------------------------------

# A job ended failed or lost. Facts: job_id, model_id, hardware_id, state, failed_stage, error, attempts.
job_failed = Signal()
# A cell's tier fell. Facts: cell_id, model_id, hardware_id, from_tier, to_tier, failed_stage, error, job_id,
# engine (the cell's NAME@VERSION). Also sent when an engine's version reaches a lower tier than its previous
# version on the same model × hardware, with previous_engine and stages (stage -> [before, now]).
tier_dropped = Signal()
# A benchmark run (a bench section's rows) was stored. Facts: run_id.
benchmark_recorded = Signal()
# A hardware pool's software stack changed. Facts: stack_change_id.
stack_changed = Signal()
# A job's agent events new to the database were stored. Facts: job_id, timestamps (the agent's time of each
# event: the ingest lag is measured to the commit).
job_events_stored = Signal()

# --- sent inside the transaction ----------------------------------------------------------------------------

# What a cell's tier is computed from changed: a job was created or moved state, results were stored or judged
# again. Facts: model_id, hardware_id, reason, history (a dict for the cell's history entry, or None), and
# optionally now (the time a tier reached without evidence time counts from: seeded evidence's clock).
cell_inputs_changed = Signal()
# A model release or a hardware was created or updated. Facts: model (a ModelRelease or None), hardware (a
# Hardware or None), created (bool), changed (the names of the fields whose values changed, old values read
# before the update).
catalog_changed = Signal()
# A hardware pool's stack change was recorded: receivers queue the re-validation jobs its policy asks for and
# keep their ids on the change. Facts: change (a StackChange), policy (its HardwarePolicy or None).
stack_change_recorded = Signal()
# A release's reference run finished: the results judged against its reference are judged again. Facts:
# release_id.
reference_recorded = Signal()
# A job was sent to its agents as a new attempt (still inside the dispatch's transaction). Facts: job (a Job).
job_dispatched = Signal()


def publish(event: Signal, **facts: Any) -> None:
    """Sends ``event`` with ``facts`` once the current transaction commits (at once outside a transaction)."""

    def send() -> None:
        for receiver, result in event.send_robust(sender=None, **facts):
            if isinstance(result, Exception):
                logger.error("receiver %s of a domain event failed", getattr(receiver, "__qualname__", receiver),
                             exc_info=(type(result), result, result.__traceback__))

    transaction.on_commit(send)


def send_now(event: Signal, **facts: Any) -> None:
    """Sends ``event`` with ``facts`` to its receivers now, inside the caller's transaction."""
    event.send(sender=None, **facts)
