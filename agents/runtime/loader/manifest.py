"""Checksum manifests of a checkpoint's weight files: ``[{"name", "size", "sha256"}]``.

``build_manifest`` hashes a checkpoint directory's shards (``day0 manifest MODEL_DIR`` prints it);
``parse_manifest`` accepts that list (bare, or under a ``"files"``/``"manifest"`` key) or the older
``{file name: sha256}`` mapping, and refuses anything else naming the entry; ``compare_manifest`` sets each
shard's ``expected_sha256`` / ``matches`` and lists the disagreements (a digest, a size, a shard missing from
either side), each naming the shard and both values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.runtime.loader.checkpoint import Checkpoint
from agents.runtime.loader.hashing import ShardHasher
from contract.manifest import check_manifest


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
    """{shard name: entry} from a manifest document; a ValueError names what is wrong. The list is validated by
    the one manifest rule the portal judges with (``contract.manifest.check_manifest``, its limits included)."""
    if isinstance(value, Mapping) and ("files" in value or "manifest" in value):
        value = value.get("files", value.get("manifest"))
    if isinstance(value, Mapping):  # the older {name: sha256} form
        value = [{"name": k, "sha256": v} for k, v in value.items()]
    if isinstance(value, list) and not value:
        raise ValueError("manifest is empty: it must list every weight file")
    try:
        entries = check_manifest(value)  # the portal's limit too: one rule for both sides
    except ValueError as exc:
        raise ValueError(f"manifest{exc}" if str(exc).startswith("[") else f"manifest {exc}") from None
    return {e["name"]: ManifestEntry(e["name"], e["sha256"], e["size"]) for e in entries}


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
