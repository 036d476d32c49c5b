"""Signatures of alert bodies (pure Python): ``X-Day0-Signature: sha256=<hex>`` is the HMAC-SHA256, keyed with
the subscription's secret, of ``<X-Day0-Timestamp>.<raw body>``. Binding the timestamp lets a receiver refuse
a replayed body (compare it with its clock); the raw bytes are what is signed, so verify before parsing."""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Day0-Signature"
TIMESTAMP_HEADER = "X-Day0-Timestamp"
DELIVERY_HEADER = "X-Day0-Delivery"
EVENT_HEADER = "X-Day0-Event"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Day0-Signature`` value of ``body`` sent at ``timestamp`` (Unix seconds)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(secret: str, timestamp: str, body: bytes, signature: str, *, now: float | None = None,
           tolerance_seconds: int = 300) -> bool:
    """What a receiver does: the signature matches (constant time) and the timestamp is within tolerance."""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if now is not None and abs(now - ts) > tolerance_seconds:
        return False
    return hmac.compare_digest(sign(secret, ts, body), signature)
