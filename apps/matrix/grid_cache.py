"""The rendered matrix (the page's grid, the API's JSON) cached in Django's cache, per what the viewer may see.

A key holds the viewer's *scope* and a digest of everything else the output depends on (filters, page, the
viewer's open regression flags); an entry holds the matrix *version* it was built under. The version is one
integer in the cache, replaced whenever a cell, a model, a hardware or an engine changes (``matrix_changed``: at
the write and again once its transaction commits, so a reader that raced the write cannot keep its stale render
under the new version); an entry of another version is a miss and is rebuilt in place. The scope is what decides
which rows exist for a viewer: every model for staff, else the public ones plus those of the viewer's
organizations — two viewers share an entry only when they see the same
rows. An embargo that ends changes what the public sees without a write, so an entry for a non-staff viewer
expires no later than the next embargo's end."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import secrets
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from django.core.cache import cache
from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from apps.accounts.access import Actor

logger = logging.getLogger(__name__)
VERSION_KEY = "day0:matrix:version"
GRID_SECONDS = 3600  # an entry nobody invalidated still leaves after an hour
T = TypeVar("T")


def version() -> int:
    """The current matrix version: a random token (a missing or unreadable one is replaced, so a flushed or
    tampered cache never makes an old entry current again)."""
    current = cache.get(VERSION_KEY)
    if isinstance(current, int):
        return current
    fresh = secrets.randbits(62)
    cache.set(VERSION_KEY, fresh, None)
    return fresh


def bump() -> None:
    """A new version: every entry built under another one is stale. A cache that cannot be written is logged,
    never raised: the write that called this is already stored (and a cache that is down serves nothing)."""
    try:
        cache.set(VERSION_KEY, secrets.randbits(62), None)
    except Exception:  # noqa: BLE001 - any backend's connection error
        logger.warning("matrix cache: the version could not be replaced", exc_info=True)


def matrix_changed() -> None:
    """Every rendered matrix is stale: call where a cell, a model or a hardware is written (inside or outside a
    transaction)."""
    bump()
    transaction.on_commit(bump)


def scope(actor: Actor) -> str:
    """Which rows the viewer may see, as a key part (``apps.catalog.selectors.visible_models_q``'s cases)."""
    if actor.is_staff:
        return "staff"
    return "orgs-" + "-".join(map(str, sorted(actor.org_ids))) if actor.org_ids else "public"


def _timeout(actor: Actor) -> int:
    """Seconds an entry may live: until the next embargo ends (non-staff), at most ``GRID_SECONDS``."""
    if actor.is_staff:
        return GRID_SECONDS
    from apps.catalog.choices import Visibility
    from apps.catalog.models import ModelRelease

    now = timezone.now()
    nxt = ModelRelease.objects.filter(visibility=Visibility.PRIVATE, released_at__gt=now).aggregate(
        at=Min("released_at"))["at"]
    if nxt is None:
        return GRID_SECONDS
    return max(1, min(GRID_SECONDS, math.ceil((nxt - now).total_seconds())))


def digest(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _pack(value: Any) -> str:
    """A rendered grid or JSON body is megabytes of repetitive text: stored zlib-compressed (level 1) in base64,
    a string the cache's JSON serializer passes through without escaping every quote (a tenth of the bytes to
    Redis and back, and a fast read). A string is stored as itself ("t"), other data as JSON ("j")."""
    kind, text = ("t", value) if isinstance(value, str) else ("j", json.dumps(value, separators=(",", ":")))
    return kind + base64.b64encode(zlib.compress(text.encode(), 1)).decode("ascii")


def _unpack(packed: Any) -> Any:
    if not isinstance(packed, str) or packed[:1] not in ("t", "j", "d"):
        return None
    try:
        raw = base64.b64decode(packed[1:], validate=True)
        if packed[0] == "d":  # pieces (``cached_pieces``): the UTF-8 bytes as they were
            return zlib.decompress(raw, -15)
        text = zlib.decompress(raw).decode()
        return text if packed[0] == "t" else json.loads(text)
    except (ValueError, zlib.error):  # not ours: a miss
        return None


class Piece(NamedTuple):
    """Part of a text: its UTF-8 bytes and, compressed alone, its raw deflate blocks (``piece``)."""

    data: bytes
    deflated: bytes


_END = zlib.compressobj(1, zlib.DEFLATED, -15).flush()  # an empty last block: ends pieces joined as one stream


def piece(data: bytes) -> Piece:
    """``data`` with its raw deflate blocks, compressed without reference to anything before and ended on a byte
    boundary (a sync flush, not a last block): any such pieces joined, then ``_END``, are one deflate stream. A
    piece kept by its builder (a row of the API's matrix) is compressed once, not at every rebuild."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, -15)
    return Piece(data, compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH))


def _lookup(kind: str, actor: Actor, parts: Any) -> tuple[str, int, Any]:
    key = f"day0:matrix:{kind}:{scope(actor)}:{digest(parts)}"
    current = version()
    entry = cache.get(key)
    if isinstance(entry, dict) and entry.get("v") == current:
        return key, current, _unpack(entry.get("z"))
    return key, current, None


def cached(kind: str, actor: Actor, parts: Any, build: Callable[[], T]) -> T:
    """``build()``'s value (JSON data: strings, numbers, lists, dicts) from the cache when it was built under the
    current version, else built and stored with it. The version is read before ``build`` reads the database, so
    an entry built while a write committed carries the version before it and is never served after."""
    key, current, hit = _lookup(kind, actor, parts)
    if hit is not None and not isinstance(hit, bytes):
        return hit
    value = build()
    cache.set(key, {"v": current, "z": _pack(value)}, _timeout(actor))
    return value


def cached_pieces(kind: str, actor: Actor, parts: Any, build: Callable[[], list[Piece]]) -> bytes:
    """``cached`` for bytes built as pieces: stored as their deflate blocks joined (no compression of the whole),
    read back as the joined bytes."""
    key, current, hit = _lookup(kind, actor, parts)
    if isinstance(hit, bytes):
        return hit
    pieces = build()
    packed = "d" + base64.b64encode(b"".join([*(p.deflated for p in pieces), _END])).decode("ascii")
    cache.set(key, {"v": current, "z": packed}, _timeout(actor))
    return b"".join(p.data for p in pieces)


def on_catalog_change(sender: type, **kwargs: Any) -> None:  # noqa: ARG001 - a signal receiver
    """``post_save``/``post_delete`` of a model, a hardware, an engine or a cell: names, release times, visibility,
    configs and which engine's cell ranks best show in the grid."""
    matrix_changed()
