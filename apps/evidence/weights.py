"""Weight probes: the agent proves it read the weights it claims to have loaded.

A release's reference run samples its shards: its payload carries ``weight_samples`` ``{"count", "length",
"positions"}`` (fractions in [0, 1) drawn with ``secrets``); its load section returns, per shard, the bytes at
``offset = floor(position × (size − length))`` (``weight_samples: [{"file", "size", "samples": [{"offset",
"bytes_b64"}]}]``), which the portal keeps (``WeightSamples``), never in any API answer. Each attempt of a
certify job then carries ``weight_probe`` ``{"nonce", "probes": [{"file", "offset", "length"}]}``: a few of
those ranges per shard, drawn per attempt and kept secret (``WeightDraw``); its load section answers
``weight_probe: [{"file", "offset", "length", "sha256"}]`` with ``sha256(nonce as ASCII + the bytes)``, and
the load verdict (``contract/verdicts/load.py``) compares them with the portal's own hashes. The stored
sections keep only counts: the bytes, the positions and the answers stay in the two secret tables."""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from apps.core import parsing as p
from apps.evidence.judging_facts import is_reference_job
from apps.evidence.models import WeightDraw, WeightSamples
from apps.jobs.models import Job

SAMPLE_COUNT = 16  # samples per shard a reference run reads
SAMPLE_LENGTH = 64  # bytes per sample
MAX_SAMPLES_PER_SHARD = 64
MAX_SAMPLE_BYTES = 1024
MAX_SAMPLE_SHARDS = 10_000
PROBES_PER_SHARD = 4
MAX_PROBES = 4096  # per attempt, over all shards
_RNG = secrets.SystemRandom()


def _positions(count: int) -> list[float]:
    return [secrets.randbelow(1 << 53) / (1 << 53) for _ in range(count)]


def sample_offset(position: float, size: int, length: int) -> int:
    """Where a sample at ``position`` (a fraction in [0, 1)) starts in a file of ``size`` bytes."""
    return math.floor(position * max(size - length, 0))


def _draw_probes(model_id: int) -> list[dict[str, Any]]:
    """A few stored samples per shard (``PROBES_PER_SHARD``, at most ``MAX_PROBES`` in all), with their bytes."""
    rows = list(WeightSamples.objects.filter(model_id=model_id).values_list("file", "samples"))
    if len(rows) > MAX_PROBES:
        rows = _RNG.sample(rows, MAX_PROBES)
    per_shard = max(1, min(PROBES_PER_SHARD, MAX_PROBES // max(len(rows), 1)))
    probes = []
    for file, samples in sorted(rows):
        samples = [s for s in samples if s[1]]  # an empty file has no bytes to ask about
        for offset, data in sorted(_RNG.sample(samples, min(per_shard, len(samples)))):
            probes.append({"file": file, "offset": offset, "length": len(data) // 2, "hex": data})
    return probes


def payload_for(job: Job) -> dict[str, Any]:
    """The weight challenge of ``job``'s current attempt, for its payload: ``weight_samples`` for a reference
    run, ``weight_probe`` for a certify job of a release with reference samples, else nothing. Drawn once per
    attempt and nonce, and kept."""
    if "load" not in (job.stages or ["load"]) or not job.nonce:
        return {}
    draw = WeightDraw.objects.filter(job=job, attempt=job.attempts).first()
    if draw is not None and draw.nonce != job.nonce:  # the attempt was sent again (the broker refused it)
        draw.delete()
        draw = None
    if draw is None:
        if is_reference_job(job):
            kind, spec = "samples", {"count": SAMPLE_COUNT, "length": SAMPLE_LENGTH,
                                     "positions": _positions(SAMPLE_COUNT)}
        else:
            probes = _draw_probes(job.model_id)
            if not probes:
                return {}
            kind, spec = "probe", {"probes": probes}
        draw = WeightDraw.objects.create(job=job, attempt=job.attempts, nonce=job.nonce, kind=kind, spec=spec)
    if draw.kind == "samples":
        return {"weight_samples": draw.spec}
    return {"weight_probe": {"nonce": draw.nonce, "probes": [
        {"file": q["file"], "offset": q["offset"], "length": q["length"]} for q in draw.spec["probes"]]}}


def probe_facts(job: Job, *, stored: bool = False) -> dict[str, Any] | None:
    """What the load verdict checks the weight probe with (``Context.weight_probe``): the expected hash of
    every range this attempt was asked, and the answers the portal kept; None for a reference run. ``stored``:
    judging a stored load again, whose answers are those of the newest attempt that answered."""
    if is_reference_job(job):
        return None
    draws = WeightDraw.objects.filter(job=job, kind="probe")
    draw = draws.filter(answers__isnull=False).order_by("-attempt").first() if stored else None
    if draw is None:
        draw = draws.filter(attempt=job.attempts, nonce=job.nonce).first()
    if draw is None:
        return {"probes": [], "reason": "no reference samples"}
    nonce = draw.nonce.encode("ascii")
    expected = [{"file": q["file"], "offset": q["offset"], "length": q["length"],
                 "sha256": hashlib.sha256(nonce + bytes.fromhex(q["hex"])[:q["length"]]).hexdigest()}
                for q in draw.spec["probes"]]
    return {"nonce": draw.nonce, "probes": expected, "answers": draw.answers}


@dataclass
class LoadSecrets:
    """A load section's secret parts, validated and taken out of what is stored in ``StageResult.section``."""

    stored_section: dict[str, Any]
    answers: list[dict[str, Any]] | None = None
    samples: list[tuple[str, int, list[list[Any]]]] = field(default_factory=list)

    def save(self, job: Job, passed: bool) -> None:
        """Keeps the probe answers with the attempt's draw, and a passing reference run's samples."""
        WeightDraw.objects.filter(job=job, attempt=job.attempts, kind="probe").update(answers=self.answers)
        if self.samples and passed and is_reference_job(job):
            WeightSamples.objects.filter(model_id=job.model_id).delete()
            WeightSamples.objects.bulk_create([WeightSamples(model_id=job.model_id, file=file, size=size,
                                                             samples=samples, job=job)
                                               for file, size, samples in self.samples])


def hold_load_secrets(job: Job, section: Any) -> LoadSecrets | None:
    """Validates a load section's ``weight_probe`` answers and ``weight_samples`` (a 400 naming the path) and
    returns them apart from the section that is stored; None without a load section."""
    if not isinstance(section, dict):
        return None
    path = "stages.load"
    stored = dict(section)
    held = LoadSecrets(stored_section=stored)
    if "weight_probe" in section:
        held.answers = _answers(section.get("weight_probe"), f"{path}.weight_probe")
        stored["weight_probe"] = {"answers": len(held.answers), "kept": "by the portal (secret)"}
    if "weight_samples" in section:
        held.samples = _samples(job, section.get("weight_samples"), f"{path}.weight_samples")
        stored["weight_samples"] = {"shards": len(held.samples),
                                    "samples": sum(len(s) for _, _, s in held.samples),
                                    "kept": "by the portal (secret)"}
    return held


def _answers(value: Any, path: str) -> list[dict[str, Any]]:
    out = []
    for i, raw in enumerate(p.arr(value, path, max_items=MAX_PROBES)):
        at, row = f"{path}[{i}]", p.obj(raw, f"{path}[{i}]")
        digest = p.text(row, "sha256", at, max_length=64, required=True)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
            raise p.fail(f"{at}.sha256", "must be 64 hexadecimal digits")
        out.append({"file": p.text(row, "file", at, required=True),
                    "offset": p.integer(row, "offset", at, required=True, low=0, high=1 << 62),
                    "length": p.integer(row, "length", at, required=True, low=1, high=MAX_SAMPLE_BYTES),
                    "sha256": digest.lower()})
    return out


def _samples(job: Job, value: Any, path: str) -> list[tuple[str, int, list[list[Any]]]]:
    """Each shard's samples as ``(file, size, [[offset, hex], ...])``; on a reference run each offset must be
    where this attempt's positions put it."""
    draw = WeightDraw.objects.filter(job=job, attempt=job.attempts, kind="samples").first()
    if not is_reference_job(job) or draw is None or draw.nonce != job.nonce:
        raise p.fail(path, "only a reference run's load returns weight samples, for the positions its attempt "
                           "was sent")
    positions, length = draw.spec["positions"], draw.spec["length"]
    out = []
    for i, raw in enumerate(p.arr(value, path, max_items=MAX_SAMPLE_SHARDS)):
        at, row = f"{path}[{i}]", p.obj(raw, f"{path}[{i}]")
        file = p.text(row, "file", at, required=True)
        size = p.integer(row, "size", at, required=True, low=0, high=1 << 62)
        rows = p.arr(row.get("samples"), f"{at}.samples", max_items=MAX_SAMPLES_PER_SHARD)
        if len(rows) != len(positions):
            raise p.fail(f"{at}.samples", f"has {len(rows)} samples; the run was sent {len(positions)} positions")
        samples = []
        for j, (raw_sample, position) in enumerate(zip(rows, positions, strict=True)):
            sat, sample = f"{at}.samples[{j}]", p.obj(raw_sample, f"{at}.samples[{j}]")
            offset = p.integer(sample, "offset", sat, required=True, low=0, high=1 << 62)
            want = sample_offset(position, size, length)
            if offset != want:
                raise p.fail(f"{sat}.offset", f"{offset} is not where position {position} puts it in {size} bytes "
                                              f"({want})")
            try:
                data = base64.b64decode(p.text(sample, "bytes_b64", sat, max_length=4 * MAX_SAMPLE_BYTES,
                                               required=True), validate=True)
            except (binascii.Error, ValueError):
                raise p.fail(f"{sat}.bytes_b64", "must be base64") from None
            if len(data) != min(length, size - offset):
                raise p.fail(f"{sat}.bytes_b64", f"holds {len(data)} bytes; a sample is {min(length, size - offset)}")
            samples.append([offset, data.hex()])
        out.append((file, size, samples))
    return out
