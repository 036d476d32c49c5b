"""The domain events alerts subscribe to (``apps.core.events``, published after commit by the app that owns the
fact), each turned into the deliveries of its kind (``services.do_publish_alert``): connected in
``AlertsConfig.ready``."""

from __future__ import annotations

import logging
from typing import Any

from apps.alerts import services
from apps.alerts.choices import AlertKind
from apps.alerts.models import Delivery
from apps.alerts.regressions import alert_benchmark_run_task
from apps.catalog.models import Hardware, ModelRelease
from apps.core import events
from apps.fleet.models import StackChange
from contract.engines import DEFAULT_ENGINE
from contract.tiers import TIER_NAMES

logger = logging.getLogger(__name__)


def do_alert_tier_drop(*, model_id: int, hardware_id: int, from_tier: int, to_tier: int, failed_stage: str,
                       error: str, job_id: int | None, engine: str = "", previous_engine: str = "",
                       stages: dict[str, list[str]] | None = None, **_: Any) -> list[Delivery]:
    """A cell's tier fell (the ``tier_dropped`` event the matrix publishes when it recomputes a lower tier), or an
    engine's new version reaches a lower tier than its previous one on the same model × hardware
    (``previous_engine``: that version; ``stages``: what passed there and no longer does)."""
    if to_tier >= from_tier:
        return []
    model, hardware = ModelRelease.objects.get(pk=model_id), Hardware.objects.get(pk=hardware_id)
    reason = f" (failed at {failed_stage})" if failed_stage else ""
    if previous_engine:
        lost = ", ".join(f"{stage} {was} → {now}" for stage, (was, now) in (stages or {}).items())
        summary = (f"{model.slug} on {hardware.slug}: {engine} regressed against {previous_engine}, tier "
                   f"{from_tier} ({TIER_NAMES[from_tier]}) → {to_tier} ({TIER_NAMES[to_tier]})"
                   + (f": {lost}" if lost else reason))
    else:
        on = f" with {engine}" if engine and engine != DEFAULT_ENGINE else ""
        summary = (f"{model.slug} on {hardware.slug}{on} dropped from tier {from_tier} "
                   f"({TIER_NAMES[from_tier]}) to {to_tier} ({TIER_NAMES[to_tier]}){reason}")
    data: dict[str, Any] = {"from_tier": from_tier, "to_tier": to_tier, "failed_stage": failed_stage,
                            "error": (error or "")[:2000], "job": job_id}
    if engine and (engine != DEFAULT_ENGINE or previous_engine):
        data.update(engine=engine, previous_engine=previous_engine or None, stages=stages or {})
    return services.do_publish_alert(AlertKind.TIER_DROP, summary=summary, model=model, hardware=hardware, data=data)


def do_alert_job_failed(*, job_id: int, model_id: int, hardware_id: int, state: str, failed_stage: str, error: str,
                        attempts: int, **_: Any) -> list[Delivery]:
    """A job ended failed or lost (the ``job_failed`` event the jobs app publishes)."""
    model, hardware = ModelRelease.objects.get(pk=model_id), Hardware.objects.get(pk=hardware_id)
    where = f" at {failed_stage}" if failed_stage else ""
    summary = f"job {job_id} ({model.slug} on {hardware.slug}) {state}{where}: {(error or '')[:300]}"
    return services.do_publish_alert(
        AlertKind.JOB_FAILED, summary=summary.rstrip(": "), model=model, hardware=hardware,
        data={"job": job_id, "state": str(state), "failed_stage": failed_stage, "error": (error or "")[:2000],
              "attempts": attempts, "job_url": services.link(f"/jobs/{job_id}/")})


def do_alert_stack_change(*, stack_change_id: int, **_: Any) -> list[Delivery]:
    """A hardware pool's stack changed (the ``stack_changed`` event of ``fleet.stacks``): its organization's
    subscribers (everyone's, for a shared catalog entry) hear what changed and the re-validation jobs queued."""
    change = StackChange.objects.select_related("hardware").filter(pk=stack_change_id).first()
    if change is None:
        return []
    what = ", ".join(f"{k} {change.before.get(k)} → {change.after.get(k)}" for k in change.changed)
    jobs = f"; {len(change.jobs)} re-validation job{'s' if len(change.jobs) != 1 else ''} queued" if change.jobs else ""
    return services.do_publish_alert(
        AlertKind.STACK_CHANGE, summary=f"{change.hardware.slug} stack changed: {what}{jobs}", hardware=change.hardware,
        organization_id=change.hardware.organization_id,
        data={"stack_change": change.pk, "changed": change.changed, "before": change.before, "after": change.after,
              "host": change.hostname, "policy": change.policy, "jobs": change.jobs})


def queue_benchmark_run_check(*, run_id: int, **_: Any) -> None:
    """A portal task looks for the regressions of a stored benchmark run (the ``benchmark_recorded`` event)."""
    try:
        alert_benchmark_run_task.delay(run_id)
    except Exception:  # a broker outage must not fail the results upload
        logger.exception("regression check of benchmark run %s could not be queued", run_id)


def connect() -> None:
    events.job_failed.connect(do_alert_job_failed, dispatch_uid="alerts.job_failed")
    events.tier_dropped.connect(do_alert_tier_drop, dispatch_uid="alerts.tier_dropped")
    events.benchmark_recorded.connect(queue_benchmark_run_check, dispatch_uid="alerts.benchmark_recorded")
    events.stack_changed.connect(do_alert_stack_change, dispatch_uid="alerts.stack_changed")
