"""Where a release's checksum manifest comes from, and what is shown while it has none.

A manifest comes from the release's creator (``given``), from staff (``staff``: a PATCH, or settling a
disagreement) or from the reference run's load (``reference``: a passing load of a ``purpose="reference"`` job
on ``reference`` hardware) — never from a vendor's load. Without one (or with a legacy "first seen" one, which
is never compared with), each hardware's digests are kept apart: per hardware, the newest passing load's shard
digests. Where two hardware loaded different bytes the release shows the disagreement (model API, cell page)
until staff settle it by choosing a hardware's digests or giving a manifest; nothing an agent posts sets a
release-wide flag. When the manifest changes, the release's stored results are judged again (``rejudge.rejudge_results``)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from apps.accounts.access import Actor, actor_username
from apps.catalog.models import ModelRelease
from apps.catalog.selectors import has_trusted_manifest
from apps.evidence.models import ShardChecksum, StageResult
from apps.evidence.rejudge import rejudge_results
from apps.jobs.models import Job
from contract.manifest import check_manifest

MAX_SHOWN_FILES = 20  # disagreeing files listed on the model API (the count says how many in all)


def hardware_digests(model_id: int) -> list[dict[str, Any]]:
    """Per hardware that loaded the release: its newest passing load ``{"hardware", "job", "at", "shards":
    {file: sha256}}``, hardware slug order (one query: a passing load always lists its shards)."""
    passing = StageResult.objects.filter(job__model_id=model_id, stage="load", verdict="pass")
    newest = passing.filter(job__hardware_id=OuterRef("job__hardware_id")).order_by("-created_at", "-id")
    rows = (ShardChecksum.objects.filter(load__result__in=passing.filter(id=Subquery(newest.values("id")[:1])))
            .values_list("load__result__job__hardware__slug", "load__result__job_id", "load__result__created_at",
                         "file", "sha256"))
    loads: dict[str, dict[str, Any]] = {}
    for slug, job_id, at, file, digest in rows:
        load = loads.setdefault(slug, {"hardware": slug, "job": job_id, "at": at.isoformat(), "shards": {}})
        load["shards"][file] = digest.lower()
    return [loads[slug] for slug in sorted(loads)]


def digest_disagreement(model: ModelRelease) -> dict[str, Any] | None:
    """None while the release has a manifest loads are compared with, or while every hardware loaded the same
    bytes. Else the disagreement: the first differing file as two hardware saw it (``file``, ``hardware``,
    ``sha256``, ``jobs``), how many files differ, each file's digest per hardware (the first
    ``MAX_SHOWN_FILES``), and the hardware grouped by identical digests (what staff choose from to settle)."""
    if has_trusted_manifest(model):
        return None
    loads = hardware_digests(model.pk)
    if len(loads) < 2:
        return None
    files: list[dict[str, Any]] = []
    for name in sorted({f for load in loads for f in load["shards"]}):
        seen = {load["hardware"]: load["shards"][name] for load in loads if name in load["shards"]}
        if len(set(seen.values())) > 1:
            files.append({"file": name, "sha256": seen})
    if not files:
        return None
    first = files[0]
    (a, x), (b, y) = _two_differing(first["sha256"])
    job_of = {load["hardware"]: load["job"] for load in loads}
    groups: dict[tuple, list[str]] = {}
    for load in loads:
        groups.setdefault(tuple(sorted(load["shards"].items())), []).append(load["hardware"])
    return {"file": first["file"], "hardware": [a, b], "sha256": [x, y], "jobs": [job_of[a], job_of[b]],
            "files_differing": len(files), "files": files[:MAX_SHOWN_FILES],
            "groups": [{"hardware": hw, "jobs": [job_of[h] for h in hw]} for hw in groups.values()],
            "settle": f"/api/v1/models/{model.slug}/manifest/settle/ (staff)"}


def _two_differing(per_hardware: dict[str, str]) -> tuple[tuple[str, str], tuple[str, str]]:
    items = sorted(per_hardware.items())
    first = items[0]
    second = next(item for item in items[1:] if item[1] != first[1])
    return first, second


def _manifest_of_load(result_id: int) -> list[dict[str, Any]]:
    """The manifest ``[{name, size, sha256}]`` of a stored load (sizes from its section, where it gave them)."""
    section = StageResult.objects.filter(pk=result_id).values_list("section", flat=True).first() or {}
    sizes = {str(s.get("file")): s.get("size", s.get("bytes")) for s in section.get("shards") or []
             if isinstance(s, dict)}
    rows = ShardChecksum.objects.filter(load__result_id=result_id).order_by("file").values_list("file", "sha256")
    return check_manifest([{"name": f, "size": sizes.get(f) if isinstance(sizes.get(f), int) else None,
                            "sha256": d} for f, d in rows])


@transaction.atomic
def check_settle_manifest(actor: Actor, model: ModelRelease, *, hardware: str | None = None,
                          manifest: Any = None) -> ModelRelease:
    """Staff settle a release's digests: the manifest becomes ``hardware``'s newest passing load's digests, or
    ``manifest`` as given (``manifest_source`` "staff"); the disagreement is gone since loads are now compared
    with it. Exactly one of the two; a hardware without a passing load of the release is a 400 naming it."""
    if not actor.is_staff:
        raise PermissionDenied("settling a release's manifest needs staff")
    if (hardware is None) == (manifest is None):
        raise ValidationError({"detail": "give exactly one of 'hardware' (whose digests become the manifest) "
                                         "and 'manifest' ([{name, size, sha256}])"})
    seen: dict[str, Any] = {"by": actor_username(actor), "at": timezone.now().isoformat()}
    if hardware is not None:
        load = next((row for row in hardware_digests(model.pk) if row["hardware"] == hardware), None)
        if load is None:
            raise ValidationError({"hardware": f"{hardware!r} has no passing load of {model.slug}"})
        result_id = StageResult.objects.filter(job_id=load["job"], stage="load").values_list("id", flat=True).first()
        entries = _manifest_of_load(result_id)
        seen.update(hardware=hardware, job=load["job"])
    else:
        try:
            entries = check_manifest(manifest)
        except ValueError as exc:
            raise ValidationError({"manifest": str(exc)}) from None
        if not entries:
            raise ValidationError({"manifest": "must list every weight file"})
    locked = ModelRelease.objects.select_for_update().get(pk=model.pk)
    locked.manifest, locked.manifest_source, locked.manifest_seen = entries, "staff", seen
    locked.save(update_fields=["manifest", "manifest_source", "manifest_seen", "updated_at"])
    rejudge_results(model=locked, reason=f"manifest settled by staff ({len(entries)} files)")
    return locked


def record_reference_load(job: Job, section: dict[str, Any]) -> None:
    """A passing load of the release's reference run: its digests become the manifest when the release has
    none (or a legacy one), and its tensor count the declared count when none is known."""
    model = ModelRelease.objects.select_for_update().get(pk=job.model_id)
    changed = []
    if not has_trusted_manifest(model):
        model.manifest = [{"name": s["file"], "size": s.get("size", s.get("bytes")) if isinstance(
            s.get("size", s.get("bytes")), int) else None, "sha256": s["sha256"].lower()} for s in section["shards"]]
        model.manifest_source = "reference"
        model.manifest_seen = {"job": job.pk, "hardware": job.hardware.slug, "at": timezone.now().isoformat()}
        changed += ["manifest", "manifest_source", "manifest_seen"]
    if model.tensor_count is None:
        model.tensor_count = section["tensors"]
        changed.append("tensor_count")
    if changed:
        model.save(update_fields=[*changed, "updated_at"])
        job.model = model
        # every hardware's stored results are now judged with it, and the cells' history says why
        rejudge_results(model=model, reason=f"manifest from the reference run (job {job.pk})")
