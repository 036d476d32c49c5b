"""Checksum manifests of a checkpoint's weight files: ``[{"name", "size", "sha256"}]``.

``build_manifest`` hashes a checkpoint directory's shards (``day0 manifest MODEL_DIR`` prints it);
``parse_manifest`` accepts that list (bare, or under a ``"files"``/``"manifest"`` key) or the older
``{file name: sha256}`` mapping, and refuses anything else naming the entry; ``compare_manifest`` sets each
shard's ``expected_sha256`` / ``matches`` and lists the disagreements (a digest, a size, a shard missing from
either side), each naming the shard and both values."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.hashing import ShardHasher

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_ENTRIES = 100_000  # a checkpoint with more shards than this is not a checkpoint


@dataclass(frozen=True)
class ManifestEntry:
    name: str
    sha256: str
    size: int | None = None  # None: the older {name: sha256} form carries no size


def build_manifest(model_dir: Path | str, *, use_cache: bool = True) -> list[dict[str, Any]]:
    """The manifest of the checkpoint in ``model_dir`` (its index's shards, or ``model.safetensors``), in
    shard-name order."""
    ckpt = Checkpoint.open(model_dir)
    digests = ShardHasher(ckpt.files, use_cache).result()
    return [{"name": p.name, "size": p.stat().st_size, "sha256": digests[p.name][0]} for p in ckpt.files]


def parse_manifest(value: Any) -> dict[str, ManifestEntry]:
    """{shard name: entry} from a manifest document; a ValueError names what is wrong."""
    if isinstance(value, Mapping) and ("files" in value or "manifest" in value):
        value = value.get("files", value.get("manifest"))
    entries: dict[str, ManifestEntry] = {}
    if isinstance(value, Mapping):  # {name: sha256}
        items: list[Any] = [{"name": k, "sha256": v} for k, v in value.items()]
    elif isinstance(value, list):
        items = value
    else:
        raise ValueError(f"manifest must be a list of {{name, size, sha256}} objects, got {type(value).__name__}")
    if not items:
        raise ValueError("manifest is empty: it must list every weight file")
    if len(items) > MAX_ENTRIES:
        raise ValueError(f"manifest lists {len(items)} files, more than {MAX_ENTRIES}")
    for i, item in enumerate(items):
        where = f"manifest[{i}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{where} is not an object with name, size and sha256")
        unknown = sorted(set(item) - {"name", "size", "sha256"})
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {', '.join(unknown)} (expected name, size, sha256)")
        name, digest, size = item.get("name"), item.get("sha256"), item.get("size")
        if not isinstance(name, str) or not name or Path(name).name != name:
            raise ValueError(f"{where}.name must be a file name without directories, got {name!r}")
        if not isinstance(digest, str) or not _SHA256.match(digest.lower()):
            raise ValueError(f"{where}.sha256 ({name}) must be 64 hex digits, got {digest!r}")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise ValueError(f"{where}.size ({name}) must be a non-negative integer of bytes, got {size!r}")
        if name in entries:
            raise ValueError(f"{where}.name {name!r} is listed twice")
        entries[name] = ManifestEntry(name, digest.lower(), size)
    return entries


def compare_manifest(shards: list[dict[str, Any]], manifest: Mapping[str, ManifestEntry]) -> list[dict[str, Any]]:
    """Mark every shard row (``file``, ``sha256``, ``size``) with ``expected_sha256`` and ``matches``, in place;
    returns the disagreements as load problems ``{tensor: None, file, problem}``."""
    problems: list[dict[str, Any]] = []
    for shard in shards:
        want = manifest.get(shard["file"])
        if want is None:
            shard.update(expected_sha256=None, matches=False)
            problems.append({"tensor": None, "file": shard["file"], "problem": "not listed in the checksum manifest"})
            continue
        shard["expected_sha256"] = want.sha256
        if want.size is not None:
            shard["expected_size"] = want.size
        reasons = []
        if shard["sha256"] != want.sha256:
            reasons.append(f"sha256 {shard['sha256']} does not match the manifest's {want.sha256}")
        if want.size is not None and shard["size"] != want.size:
            reasons.append(f"size {shard['size']} bytes does not match the manifest's {want.size}")
        shard["matches"] = not reasons
        problems += [{"tensor": None, "file": shard["file"], "problem": r} for r in reasons]
    present = {s["file"] for s in shards}
    for name in sorted(set(manifest) - present):
        problems.append({"tensor": None, "file": name,
                         "problem": f"listed in the checksum manifest (sha256 {manifest[name].sha256}) "
                                    "but not part of the checkpoint"})
    return problems
