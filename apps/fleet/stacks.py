"""Stack changes: agents report their environment lock (``agents.pipeline.env.environment_lock``) when they
register and with heartbeats; when a hardware pool's stack differs from the one it had, a ``StackChange`` is
recorded. Inside the transaction the ``stack_change_recorded`` event lets the matrix queue the re-validation
jobs the pool's ``HardwarePolicy`` asks for (``matrix.stacks``, which also says which cells are stale since a
change); after commit ``stack_changed`` tells the alerts' subscribers."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from apps.catalog.models import Hardware
from apps.core import events
from apps.evidence.models import EnvLock
from apps.fleet.choices import RevalidationPolicy
from apps.fleet.models import HardwarePolicy, HardwareStack, StackChange

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
    the newest env evidence on it). Records a ``StackChange`` when they differ, with the re-validation jobs its
    policy asks for (queued by the receivers of ``stack_change_recorded``), and publishes ``stack_changed``.
    Returns the change, or None."""
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
    events.send_now(events.stack_change_recorded, change=change, policy=policy)  # the re-validation jobs
    events.publish(events.stack_changed, stack_change_id=change.pk)
    return change


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
    if not actor.administers_hardware(hardware.organization_id):
        raise PermissionDenied(f"only those who edit hardware {hardware.slug} (its organization's admins, or staff "
                               "for a shared entry) set its re-validation policy")
    return do_set_hardware_policy(hardware, policy=policy, min_tier=min_tier)
