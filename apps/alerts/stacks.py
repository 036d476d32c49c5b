"""Stack changes: agents report their environment lock (``agents.pipeline.support.environment.environment_lock``) when they
register and with heartbeats; when a hardware pool's stack differs from the one it had, a ``StackChange`` is
recorded, subscribers are told, and the pool's ``HardwarePolicy`` decides which cells get re-validation jobs
(through ``jobs.services.do_create_job``, with the stages and settings of the cell's newest job).

A cell's evidence is *stale since <change>* while a stage it proved (its newest passing verdict) predates a
change of its hardware; only a passing verdict of every such stage after the change clears it."""

from __future__ import annotations

import copy
import logging
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.alerts.choices import AlertKind, RevalidationPolicy
from apps.alerts.models import HardwarePolicy, HardwareStack, StackChange
from apps.catalog.models import Hardware

logger = logging.getLogger(__name__)

# What makes a stack: a change in any of these re-validates (python, numpy … are recorded with evidence only).
STACK_KEYS: tuple[str, ...] = ("runtime_commit", "torch", "driver", "toolkit", "device")
VALUE_MAX = 200
MAX_REVALIDATION_JOBS = 500


def stack_of(versions: Any) -> dict[str, str]:
    """The stack keys of an environment lock, as bounded strings (absent or null keys are left out)."""
    if not isinstance(versions, dict):
        return {}
    return {k: str(versions[k])[:VALUE_MAX] for k in STACK_KEYS if versions.get(k) not in (None, "")}


def _evidence_stack(hardware: Hardware) -> dict[str, str]:
    """The stack of the newest env evidence on ``hardware`` (toolkit is not stored there)."""
    from apps.evidence.models import EnvLock

    lock = (EnvLock.objects.filter(result__job__hardware=hardware).order_by("-result__created_at", "-id")
            .values("runtime_commit", "torch", "driver", "device").first())
    return stack_of(lock or {})


def _differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Keys known on both sides whose values differ (a key one side does not report is no change)."""
    return [k for k in STACK_KEYS if k in before and k in after and before[k] != after[k]]


def validate_policy(policy: Any, min_tier: Any) -> tuple[str, int]:
    if policy not in RevalidationPolicy.values:
        raise ValidationError({"policy": f"must be one of {', '.join(RevalidationPolicy.values)}, got {policy!r}"})
    if isinstance(min_tier, bool) or not isinstance(min_tier, int) or not 1 <= min_tier <= 6:
        raise ValidationError({"min_tier": f"must be a tier from 1 to 6, got {min_tier!r}"})
    return policy, min_tier


def do_set_hardware_policy(hardware: Hardware, *, policy: str, min_tier: int = 1) -> HardwarePolicy:
    """Sets what a stack change of ``hardware`` re-validates (``off``, cells at or above ``min_tier``, ``all``)."""
    policy, min_tier = validate_policy(policy, min_tier)
    row, _ = HardwarePolicy.objects.update_or_create(hardware=hardware,
                                                     defaults={"policy": policy, "min_tier": min_tier})
    return row


@transaction.atomic
def do_observe_stack(hardware: Hardware, *, hostname: str, versions: Any) -> StackChange | None:
    """Compares the stack an agent of ``hardware`` reports with the pool's last one (or, the first time, with
    the newest env evidence on it). Records a ``StackChange`` when they differ, queues the re-validation
    jobs its policy asks for, and publishes a ``stack_change`` alert. Returns the change, or None."""
    after = stack_of(versions)
    if not after:
        return None
    known = HardwareStack.objects.select_for_update().filter(hardware=hardware).first()
    before = dict(known.lock) if known is not None else _evidence_stack(hardware)
    changed = _differences(before, after)
    merged = {**before, **after}
    if known is None:
        HardwareStack.objects.create(hardware=hardware, lock=merged, reported_by=hostname[:255])
    elif merged != known.lock:
        known.lock, known.reported_by = merged, hostname[:255]
        known.save(update_fields=["lock", "reported_by", "updated_at"])
    if not changed:
        return None
    policy = HardwarePolicy.objects.filter(hardware=hardware).first()
    change = StackChange.objects.create(hardware=hardware, hostname=hostname[:255], before=before, after=merged,
                                        changed=changed, policy=policy.policy if policy else RevalidationPolicy.OFF)
    change.jobs = _queue_revalidation(hardware, policy, change)
    change.save(update_fields=["jobs"])
    _publish(change)
    return change


def _queue_revalidation(hardware: Hardware, policy: HardwarePolicy | None, change: StackChange) -> list[int]:
    """One job per affected cell, with the stages and settings of the cell's newest agent job (seeded,
    synthetic jobs are not re-run); cells with a job still active are skipped (it runs on the new stack)."""
    from apps.jobs.choices import ACTIVE_STATES
    from apps.jobs.models import Job
    from apps.jobs.services import do_create_job
    from apps.matrix.models import Cell

    if policy is None or policy.policy == RevalidationPolicy.OFF:
        return []
    min_tier = policy.min_tier if policy.policy == RevalidationPolicy.AT_OR_ABOVE_TIER else 1
    cells = Cell.objects.filter(hardware=hardware, tier__gte=min_tier).select_related("model").order_by("id")
    busy = set(Job.objects.filter(hardware=hardware, state__in=ACTIVE_STATES).values_list("model_id", flat=True))
    queued: list[int] = []
    for cell in cells[:MAX_REVALIDATION_JOBS]:
        if cell.model_id in busy:
            continue
        recent = Job.objects.filter(model_id=cell.model_id, hardware=hardware).order_by("-created_at", "-id")[:50]
        last = next((j for j in recent if not (j.spec or {}).get("seeded")), None)  # NULL-safe, unlike exclude()
        if last is None or not last.stages:
            continue
        spec = copy.deepcopy(last.spec)
        spec["revalidation"] = {"stack_change": change.pk, "changed": change.changed, "of_job": last.pk}
        job = do_create_job(model=cell.model, hardware=hardware, spec=spec, organization_id=last.organization_id,
                            requested_by_id=None)
        queued.append(job.pk)
    return queued


def _publish(change: StackChange) -> None:
    from apps.alerts.services import do_publish_alert

    what = ", ".join(f"{k} {change.before.get(k)} → {change.after.get(k)}" for k in change.changed)
    jobs = f"; {len(change.jobs)} re-validation job{'s' if len(change.jobs) != 1 else ''} queued" if change.jobs else ""
    do_publish_alert(AlertKind.STACK_CHANGE, summary=f"{change.hardware.slug} stack changed: {what}{jobs}",
                     hardware=change.hardware, organization_id=change.hardware.organization_id,
                     data={"stack_change": change.pk, "changed": change.changed, "before": change.before,
                           "after": change.after, "host": change.hostname, "policy": change.policy,
                           "jobs": change.jobs})


def cell_stack(model_id: int, hardware_id: int) -> dict[str, Any]:
    """Which stack a cell's evidence came from (its newest env evidence) and whether it is stale: the stages
    whose newest passing verdict predates a stack change of the hardware (``stale_stages``), ``stale_since``
    the first such change. A stage is proved again only by a passing verdict after the change, so a newer
    result of another stage (or a failing one) clears nothing. Three queries."""
    from django.db.models import Max

    from apps.evidence.models import EnvLock, StageResult
    from contract.verdicts import PASS

    proved = dict(StageResult.objects.filter(job__model_id=model_id, job__hardware_id=hardware_id, verdict=PASS)
                  .values("stage").annotate(latest=Max("created_at")).values_list("stage", "latest"))
    env = (EnvLock.objects.filter(result__job__model_id=model_id, result__job__hardware_id=hardware_id)
           .order_by("-result__created_at", "-id")
           .values("runtime_commit", "torch", "driver", "device", "result__job_id", "result__created_at").first())
    change, stale_stages = None, []
    if proved:
        changes = list(StackChange.objects.filter(hardware_id=hardware_id, created_at__gt=min(proved.values()))
                       .order_by("created_at", "id")[:MAX_REVALIDATION_JOBS])
        for stage, at in sorted(proved.items()):
            first = next((c for c in changes if c.created_at > at), None)
            if first is not None:
                stale_stages.append(stage)
                if change is None or (first.created_at, first.pk) < (change.created_at, change.pk):
                    change = first
    return {
        "evidence_stack": stack_of(env) if env else None,
        "evidence_job": env["result__job_id"] if env else None,
        "evidence_at": env["result__created_at"].isoformat() if env else None,
        "stale": change is not None,
        "stale_since": change.created_at.isoformat() if change else None,
        "stale_stages": stale_stages,
        "stack_change": ({"id": change.pk, "changed": change.changed, "before": change.before,
                          "after": change.after, "jobs": change.jobs} if change else None),
    }


def series_stack_changes(series: Any, *, limit: int = 200) -> list[dict[str, Any]]:
    """The stack changes of the hardware of ``series`` (``benchmarks.selectors.Series``) since their first
    point, oldest first: the benchmark API returns them beside the series to mark on the time axis."""
    series = list(series)
    points = [p.at for s in series for p in s.points]
    if not points:
        return []
    slugs = sorted({s.hardware for s in series})
    rows = (StackChange.objects.filter(hardware__slug__in=slugs, created_at__gte=min(points))
            .select_related("hardware")
            .order_by("-created_at", "-id")[:limit])
    return [{"id": c.pk, "hardware": c.hardware.slug, "at": c.created_at.isoformat(), "changed": c.changed,
             "after": {k: c.after.get(k) for k in c.changed}} for c in reversed(list(rows))]


def check_set_hardware_policy(actor: Any, hardware: Hardware, *, policy: Any, min_tier: Any = 1) -> HardwarePolicy:
    """Who edits a hardware (its organization's admins, staff for a shared entry) sets its policy."""
    from django.core.exceptions import PermissionDenied

    if not actor.administers_hardware(hardware.organization_id):
        raise PermissionDenied(f"only those who edit hardware {hardware.slug} (its organization's admins, or staff "
                               "for a shared entry) set its re-validation policy")
    return do_set_hardware_policy(hardware, policy=policy, min_tier=min_tier)
