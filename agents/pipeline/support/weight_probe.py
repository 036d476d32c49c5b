"""The load stage's answers to the portal's weight challenge (standard library only).

A reference run's payload carries ``weight_samples`` ``{"count", "length", "positions"}``: the load returns, for
every shard, the bytes at ``offset = floor(position × (size − length))`` of each position (``sample_shards``).
A certify job's payload carries ``weight_probe`` ``{"nonce", "probes": [{"file", "offset", "length"}]}``: the
load returns ``sha256(nonce as ASCII + the bytes there)`` of each range (``answer_probes``), which the portal
checks against the bytes its reference run read. Both read a few small ranges with ``os.pread`` after the
verified load (the pages are usually still cached): no second pass over the weights."""

from __future__ import annotations

import base64
import hashlib
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MAX_RANGE_BYTES = 1 << 20  # a probe or sample longer than this is not one the portal sends


class ChallengeError(ValueError):
    """The challenge names a file that is not one of the loaded shards, or a range outside it."""


def _read(fd: int, offset: int, length: int) -> bytes:
    out = b""
    while len(out) < length:
        chunk = os.pread(fd, length - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return out


def _shard_path(model_dir: Path, shards: Mapping[str, int], name: Any) -> Path:
    if not isinstance(name, str) or name not in shards:
        raise ChallengeError(f"weight challenge names {name!r}, which is not a loaded shard")
    return model_dir / name


def sample_shards(model_dir: Path, shard_files: Iterable[str], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{"file", "size", "samples": [{"offset", "bytes_b64"}]}]`` for every shard, at the spec's positions."""
    positions, length = spec.get("positions"), spec.get("length")
    if not isinstance(length, int) or isinstance(length, bool) or not 0 < length <= MAX_RANGE_BYTES:
        raise ChallengeError(f"weight_samples.length {length!r} must be an integer from 1 to {MAX_RANGE_BYTES}")
    if not isinstance(positions, list) or not all(isinstance(x, int | float) and not isinstance(x, bool)
                                                  and 0 <= x < 1 for x in positions):
        raise ChallengeError("weight_samples.positions must be a list of fractions in [0, 1)")
    out = []
    for name in shard_files:
        path = model_dir / name
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            samples = []
            for position in positions:
                offset = math.floor(position * max(size - length, 0))
                data = _read(fd, offset, min(length, size - offset))
                samples.append({"offset": offset, "bytes_b64": base64.b64encode(data).decode("ascii")})
        finally:
            os.close(fd)
        out.append({"file": name, "size": size, "samples": samples})
    return out


def answer_probes(model_dir: Path, shard_sizes: Mapping[str, int], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{"file", "offset", "length", "sha256"}]``: each probe's bytes hashed after the nonce."""
    nonce = spec.get("nonce")
    probes = spec.get("probes")
    if not isinstance(nonce, str) or not nonce or not isinstance(probes, list):
        raise ChallengeError("weight_probe must carry a nonce and a list of probes")
    fds: dict[str, int] = {}
    out = []
    try:
        for probe in probes:
            if not isinstance(probe, Mapping):
                raise ChallengeError(f"weight probe {probe!r} is not an object")
            name, offset, length = probe.get("file"), probe.get("offset"), probe.get("length")
            path = _shard_path(model_dir, shard_sizes, name)
            if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0
                    and 0 < length <= MAX_RANGE_BYTES and offset + length <= shard_sizes[name]):
                raise ChallengeError(f"weight probe of {name} at offset {offset!r} ({length!r} bytes) is outside "
                                     f"its {shard_sizes[name]} bytes")
            if name not in fds:
                fds[name] = os.open(path, os.O_RDONLY)
            data = _read(fds[name], offset, length)
            out.append({"file": name, "offset": offset, "length": length,
                        "sha256": hashlib.sha256(nonce.encode("ascii") + data).hexdigest()})
    finally:
        for fd in fds.values():
            os.close(fd)
    return out


def answer_challenge(model_dir: Path, section: dict[str, Any], weight_samples: Mapping[str, Any] | None,
                     weight_probe: Mapping[str, Any] | None) -> None:
    """Adds ``weight_samples`` and/or ``weight_probe`` to a load ``section`` (its ``shards`` name the files)."""
    sizes = {str(s["file"]): int(s.get("size") or s.get("bytes") or 0) for s in section.get("shards") or []}
    if weight_samples is not None:
        section["weight_samples"] = sample_shards(model_dir, sorted(sizes), weight_samples)
    if weight_probe is not None:
        section["weight_probe"] = answer_probes(model_dir, sizes, weight_probe)
