"""One delivery attempt of an alert: the signed POST (``signing``) to the address checked again at delivery
(``urlguard``), its outcome recorded on the ``Delivery`` row, and the backoff before a retry. Run by
``tasks.deliver_alert_task``; ``services`` records the deliveries and queues them."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

from django.db.models import F
from django.utils import timezone

from apps.alerts import signing, urlguard
from apps.alerts.choices import FINAL_DELIVERY_STATES, DeliveryStatus, PayloadFormat
from apps.alerts.models import Delivery
from day0portal.env import env_int

MAX_ATTEMPTS = env_int("DAY0_ALERT_MAX_ATTEMPTS", 6, minimum=1)
BACKOFF_BASE_SECONDS = env_int("DAY0_ALERT_BACKOFF_SECONDS", 10, minimum=0)
BACKOFF_CAP_SECONDS = 3600.0
TIMEOUT_SECONDS = env_int("DAY0_ALERT_TIMEOUT_SECONDS", 10, minimum=1)
ERROR_MAX = 2000
RETRYABLE_CODES = frozenset({408, 429})


class DeliveryError(Exception):
    """An attempt that did not deliver; ``code`` is the receiver's HTTP status when it answered."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class DeliveryRefused(DeliveryError):
    """The URL's host resolves, at delivery, to an address alerts must not go to (``urlguard``): never retried."""


def body_of(delivery: Delivery) -> bytes:
    """The POST body: the event document with the delivery's id, or ``{"text": ...}`` for Slack."""
    event = dict(delivery.event, id=str(delivery.uuid))
    if delivery.subscription.format == PayloadFormat.SLACK:
        text = f"[Day-0] {event['summary']}"
        if event.get("url"):
            text += f" <{event['url']}|open>"
        doc: dict[str, Any] = {"text": text}
    else:
        doc = event
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def backoff_seconds(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``: base × 2^(attempts − 1), capped at an hour."""
    return min(BACKOFF_BASE_SECONDS * 2 ** max(attempts - 1, 0), BACKOFF_CAP_SECONDS)


def _post(delivery: Delivery, body: bytes) -> int:
    sub = delivery.subscription
    timestamp = int(time.time())
    request = urllib.request.Request(sub.url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "day0-portal-alerts/1",
        signing.EVENT_HEADER: delivery.kind, signing.DELIVERY_HEADER: str(delivery.uuid),
        signing.TIMESTAMP_HEADER: str(timestamp), signing.SIGNATURE_HEADER: signing.sign(sub.secret, timestamp, body),
    })
    try:  # resolved and checked again now, and the connection goes to the checked address
        handlers = urlguard.pinned_handlers(sub.url)
    except urlguard.DestinationRefused as exc:
        raise DeliveryRefused(f"refused: {exc}") from None
    except urlguard.Unresolvable as exc:
        raise DeliveryError(str(exc)) from None
    opener = urllib.request.build_opener(*handlers, _NoRedirect)  # a redirect would resend the body elsewhere
    try:
        with opener.open(request, timeout=TIMEOUT_SECONDS) as response:
            response.read(4096)
            return response.status
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code} {exc.reason}", code=exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(f"{type(exc).__name__}: {reason}") from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 (urllib's signature)
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} not followed", headers, fp)


def do_attempt_delivery(delivery_id: int) -> Delivery | None:
    """POSTs a pending or retrying delivery once and records the outcome (attempts, response code, last error,
    next attempt). A 2xx delivers; a 408, 429, 5xx or network error retries until ``MAX_ATTEMPTS``; any other
    answer fails at once. Returns None when the row is gone, the row unchanged when it is already final."""
    delivery = Delivery.objects.select_related("subscription").filter(pk=delivery_id).first()
    if delivery is None or delivery.status in FINAL_DELIVERY_STATES:
        return delivery
    if not delivery.subscription.active:
        return _record(delivery, DeliveryStatus.FAILED, None, "the subscription was deactivated")
    body = body_of(delivery)
    try:
        code = _post(delivery, body)
    except DeliveryError as exc:
        retry = not isinstance(exc, DeliveryRefused) and (
            exc.code is None or exc.code >= 500 or exc.code in RETRYABLE_CODES)
        out_of_attempts = delivery.attempts + 1 >= MAX_ATTEMPTS
        status = DeliveryStatus.RETRYING if retry and not out_of_attempts else DeliveryStatus.FAILED
        error = str(exc) + (f" (gave up after {MAX_ATTEMPTS} attempts)" if retry and out_of_attempts else "")
        return _record(delivery, status, exc.code, error)
    return _record(delivery, DeliveryStatus.DELIVERED, code, "")


def _record(delivery: Delivery, status: str, code: int | None, error: str) -> Delivery:
    now = timezone.now()
    Delivery.objects.filter(pk=delivery.pk).update(attempts=F("attempts") + 1)
    delivery.refresh_from_db(fields=["attempts"])
    delivery.status, delivery.response_code, delivery.last_error = status, code, error[:ERROR_MAX]
    delivery.last_attempt_at = now
    delivery.delivered_at = now if status == DeliveryStatus.DELIVERED else None
    delivery.next_attempt_at = (now + timedelta(seconds=backoff_seconds(delivery.attempts))
                                if status == DeliveryStatus.RETRYING else None)
    delivery.save(update_fields=["status", "response_code", "last_error", "last_attempt_at", "delivered_at",
                                 "next_attempt_at"])
    return delivery
