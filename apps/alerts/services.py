"""Every write to alerts: subscriptions (created, changed, removed by their organization's admins), the
events producers publish (a regression, a tier drop, a failed job, a stack change) as deliveries.

An event becomes one ``Delivery`` per matching active subscription; an embargoed model's events match only
its own organization's subscriptions. Deliveries are queued after commit to ``tasks.deliver_alert_task``,
which POSTs each once (``delivery``: signed, the address checked again) and retries with exponential backoff on
a network error, a 5xx, a 408 or a 429."""

from __future__ import annotations

import logging
import secrets as secrets_module
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from apps.accounts.access import Actor
from apps.accounts.choices import Role, Scope
from apps.accounts.models import Organization
from apps.alerts import urlguard
from apps.alerts.choices import AlertKind, DeliveryStatus, PayloadFormat
from apps.alerts.models import MAX_URL_LENGTH, Delivery, Subscription
from apps.alerts.tasks import deliver_alert_task
from apps.catalog.models import Hardware, ModelRelease
from apps.catalog.selectors import model_is_public
from day0portal.env import env_str

logger = logging.getLogger(__name__)

PUBLIC_URL = env_str("DAY0_PUBLIC_URL", "").rstrip("/")  # links in alerts; relative paths when empty
MAX_SUBSCRIPTIONS_PER_ORG = 50
SECRET_MIN, SECRET_MAX = 16, 128
NAME_MAX = 100


# --- subscriptions ------------------------------------------------------------------------------------------


def validate_url(url: Any) -> str:
    """An http(s) URL with a host, at most ``MAX_URL_LENGTH`` characters; ``ValidationError`` on ``url``."""
    if not isinstance(url, str) or not url.strip():
        raise ValidationError({"url": "is required: the http(s) URL alerts are POSTed to"})
    url = url.strip()
    if len(url) > MAX_URL_LENGTH:
        raise ValidationError({"url": f"is {len(url)} characters long; at most {MAX_URL_LENGTH} are accepted"})
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port out of range
    except ValueError as exc:
        raise ValidationError({"url": f"is not a URL: {exc}"}) from None
    if parts.scheme not in ("http", "https"):
        raise ValidationError({"url": f"must be http or https, not {parts.scheme or 'no scheme'!r}"})
    if not parts.hostname:
        raise ValidationError({"url": "has no host"})
    if parts.username or parts.password:
        raise ValidationError({"url": "must not carry credentials (user:password@): the signature authenticates"})
    if port == 0:
        raise ValidationError({"url": "port 0 is not a port"})
    try:
        urlguard.check_at_save(url)  # link-local never; loopback and private only where allowed
    except urlguard.DestinationRefused as exc:
        raise ValidationError({"url": str(exc)}) from None
    return url


def validate_kinds(kinds: Any) -> list[str]:
    if not isinstance(kinds, list) or not kinds:
        raise ValidationError({"kinds": f"must be a non-empty list of event kinds: {', '.join(AlertKind.values)}"})
    unknown = [k for k in kinds if k not in AlertKind.values]
    if unknown:
        raise ValidationError({"kinds": f"unknown {', '.join(map(repr, unknown))}; kinds are "
                                        f"{', '.join(AlertKind.values)}"})
    return sorted(set(kinds), key=AlertKind.values.index)


def _validate_fields(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "name" in fields:
        name = fields["name"]
        if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
            raise ValidationError({"name": f"must be 1 to {NAME_MAX} characters"})
        out["name"] = name.strip()
    if "url" in fields:
        out["url"] = validate_url(fields["url"])
    if "kinds" in fields:
        out["kinds"] = validate_kinds(fields["kinds"])
    if "format" in fields:
        if fields["format"] not in PayloadFormat.values:
            raise ValidationError({"format": f"must be one of {', '.join(PayloadFormat.values)}, "
                                             f"got {fields['format']!r}"})
        out["format"] = fields["format"]
    if "active" in fields:
        if not isinstance(fields["active"], bool):
            raise ValidationError({"active": "must be true or false"})
        out["active"] = fields["active"]
    if fields.get("secret") is not None:
        secret = fields["secret"]
        if not isinstance(secret, str) or not SECRET_MIN <= len(secret) <= SECRET_MAX or not secret.isprintable():
            raise ValidationError({"secret": f"must be {SECRET_MIN} to {SECRET_MAX} printable characters"})
        out["secret"] = secret
    return out


def may_manage_subscriptions(actor: Actor, organization_id: int) -> bool:
    """Organization admins (and staff sessions) manage its subscriptions and read their delivery log; through a
    token, one with the submit scope (a read-only token only reads)."""
    if actor.is_staff and actor.token is None:
        return True
    return actor.role_in(organization_id) == Role.ADMIN and actor.has_scope(Scope.SUBMIT, organization_id)


def _require_admin(actor: Actor, organization_id: int) -> None:
    if not may_manage_subscriptions(actor, organization_id):
        raise PermissionDenied("managing alert subscriptions needs the admin role in the organization")


@transaction.atomic
def do_create_subscription(*, organization: Organization, name: str, url: str, kinds: list[str],
                           format: str = PayloadFormat.JSON, secret: str | None = None, active: bool = True,
                           created_by_id: int | None = None) -> tuple[Subscription, str]:
    """Stores a subscription; generates the secret when none is given. Returns it with the secret (shown once)."""
    secret = secret or secrets_module.token_urlsafe(32)
    sub = Subscription.objects.create(organization=organization, name=name, url=url, kinds=kinds, format=format,
                                      secret=secret, active=active, created_by_id=created_by_id)
    return sub, secret


def check_create_subscription(actor: Actor, *, organization: Organization, fields: dict[str, Any]
                              ) -> tuple[Subscription, str]:
    """Admins of ``organization`` subscribe it (name, url, kinds, format, optional secret), at most
    ``MAX_SUBSCRIPTIONS_PER_ORG``; every field is checked first (``ValidationError`` naming it)."""
    _require_admin(actor, organization.pk)
    for required in ("name", "url", "kinds"):
        if required not in fields:
            raise ValidationError({required: "is required"})
    clean = _validate_fields(fields)
    if Subscription.objects.filter(organization=organization).count() >= MAX_SUBSCRIPTIONS_PER_ORG:
        raise ValidationError({"organization": f"{organization.slug} already has {MAX_SUBSCRIPTIONS_PER_ORG} "
                                               "subscriptions; remove one first"})
    return do_create_subscription(organization=organization, created_by_id=actor.user_id, **clean)


def check_update_subscription(actor: Actor, sub: Subscription, fields: dict[str, Any]) -> Subscription:
    """Admins change name, url, kinds, format, active or the secret (a new secret is never echoed back)."""
    _require_admin(actor, sub.organization_id)
    clean = _validate_fields(fields)
    for name, value in clean.items():
        setattr(sub, name, value)
    sub.save()
    return sub


def check_delete_subscription(actor: Actor, sub: Subscription) -> None:
    _require_admin(actor, sub.organization_id)
    sub.delete()


# --- publishing ---------------------------------------------------------------------------------------------


def link(path: str) -> str:
    """A link to ``path`` on the portal (absolute with DAY0_PUBLIC_URL)."""
    return f"{PUBLIC_URL}{path}"


def recipients(kind: str, model: ModelRelease | None, organization_id: int | None = None) -> list[Subscription]:
    """Active subscriptions to ``kind``: every organization's for a public model's (or no model's) events,
    only the model's own organization's while it is embargoed; only ``organization_id``'s when given (an
    owned hardware pool's stack)."""
    subs = Subscription.objects.filter(active=True)
    if model is not None and not model_is_public(model):
        subs = subs.filter(organization_id=model.organization_id)
    if organization_id is not None:
        subs = subs.filter(organization_id=organization_id)
    return [s for s in subs if kind in (s.kinds or [])]  # a JSON list filter in Python: SQLite has no contains


def enqueue_delivery(delivery_id: int) -> None:
    try:
        deliver_alert_task.delay(delivery_id)
    except Exception:  # a broker outage must not fail the producer; the row stays pending, redeliverable
        logger.exception("alert delivery %s could not be queued", delivery_id)


def do_publish_alert(kind: str, *, summary: str, model: ModelRelease | None = None,
                     hardware: Hardware | None = None, data: dict[str, Any] | None = None,
                     organization_id: int | None = None) -> list[Delivery]:
    """Records one delivery of the event per recipient (``recipients``) and queues each after commit.
    ``summary`` is one human sentence (the Slack text); ``data`` the kind's details."""
    if kind not in AlertKind.values:
        raise ValueError(f"unknown alert kind {kind!r}")
    subs = recipients(kind, model, organization_id)
    if not subs:
        return []
    path = (f"/cells/{model.slug}/{hardware.slug}/" if model is not None and hardware is not None
            else f"/hardware/{hardware.slug}/" if hardware is not None else "")
    event = {"kind": kind, "at": timezone.now().isoformat(), "summary": summary[:1000],
             "model": model.slug if model else None, "hardware": hardware.slug if hardware else None,
             "url": link(path) if path else None, "data": data or {}}
    deliveries = Delivery.objects.bulk_create([
        Delivery(subscription=s, kind=kind, model=model, hardware=hardware, event=event) for s in subs
    ])
    for d in deliveries:
        transaction.on_commit(lambda pk=d.pk: enqueue_delivery(pk))
    return deliveries


def check_redeliver(actor: Actor, delivery: Delivery) -> Delivery:
    """Admins send a delivery again (a failed one, or to test a receiver): a fresh attempt budget."""
    _require_admin(actor, delivery.subscription.organization_id)
    Delivery.objects.filter(pk=delivery.pk).update(status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=None)
    delivery.refresh_from_db()
    transaction.on_commit(lambda: enqueue_delivery(delivery.pk))
    return delivery
