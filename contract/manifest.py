"""Checksum manifests of a checkpoint's weight files, ``[{"name", "size", "sha256"}]``: the one rule that the
portal applies to a release's manifest and the runtime's loader applies to ``day0 adapt --manifest``, and how a
load's shards are compared with one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# manifest sources the load is compared with; a legacy "first seen" manifest (a vendor's first passing load,
# recorded before manifests came only from the publisher, staff or the reference run) is shown, never trusted
TRUSTED_SOURCES = frozenset({"given", "staff", "reference"})
LEGACY_SOURCES = frozenset({"first seen", "first seen (legacy)"})
MAX_MANIFEST_FILES = 10_000
_HEX = frozenset("0123456789abcdef")


def manifest_mismatches(shards: Sequence[Mapping[str, Any]], manifest: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every disagreement between loaded shards ``[{file, sha256, bytes?}]`` and a manifest
    ``[{name, size, sha256}]``, one sentence each naming the shard and both digests."""
    want = {str(m.get("name")): m for m in manifest}
    got = {str(s.get("file")): s for s in shards}
    out = []
    for name, shard in got.items():
        entry = want.get(name)
        if entry is None:
            out.append(f"shard {name} is not in the release's manifest")
            continue
        digest = str(shard.get("sha256") or "").lower()
        expected = str(entry.get("sha256") or "").lower()
        if digest != expected:
            out.append(f"shard {name} sha256 {digest or 'missing'} differs from the manifest's {expected}")
        size = shard.get("size", shard.get("bytes"))
        if isinstance(size, int) and isinstance(entry.get("size"), int) and size != entry["size"]:
            out.append(f"shard {name} is {size} bytes, the manifest says {entry['size']}")
    out += [f"shard {name} of the manifest was not loaded" for name in want if name not in got]
    return out


def shard_name_problem(name: str) -> str | None:
    """Why ``name`` is not a weight file's name (None when it is): a bare file name, no directories (a manifest's
    names and a load's shards alike)."""
    if not name or len(name) > 255 or "/" in name or "\\" in name or name in (".", ".."):
        return "must be a file name without directories (at most 255 characters)"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "must be a file name without control characters"
    return None


def sha256_problem(digest: str) -> str | None:
    """Why ``digest`` is not a sha256 digest (None when it is): 64 hexadecimal digits."""
    if len(digest) != 64 or not set(digest.lower()) <= _HEX:
        return "must be 64 hexadecimal digits (a sha256 digest)"
    return None


def check_manifest(value: Any, *, max_files: int = MAX_MANIFEST_FILES) -> list[dict[str, Any]]:
    """A checksum manifest ``[{"name", "size", "sha256"}]`` normalised (lower-case digests); a ValueError
    naming the entry and what is wrong otherwise. ``size`` may be null (unknown)."""
    if not isinstance(value, list):
        raise ValueError("must be a list of {name, size, sha256} objects")
    if len(value) > max_files:
        raise ValueError(f"lists {len(value)} files; at most {max_files} are accepted")
    out, seen = [], set()
    for i, item in enumerate(value):
        where = f"[{i}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{where} must be an object with name, size and sha256")
        unknown = sorted(set(item) - {"name", "size", "sha256"})
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown} (expected name, size, sha256)")
        name, size, digest = item.get("name"), item.get("size"), item.get("sha256")
        if not isinstance(name, str):
            raise ValueError(f"{where}.name must be a file name without directories (at most 255 characters)")
        if (problem := shard_name_problem(name)) is not None:
            raise ValueError(f"{where}.name {problem}")
        if name in seen:
            raise ValueError(f"{where}.name {name!r} is listed twice")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**63):
            raise ValueError(f"{where}.size ({name}) must be a non-negative integer of bytes or null")
        if not isinstance(digest, str) or sha256_problem(digest) is not None:
            raise ValueError(f"{where}.sha256 ({name}) must be 64 hexadecimal digits")
        seen.add(name)
        out.append({"name": name, "size": size, "sha256": digest.lower()})
    return out
