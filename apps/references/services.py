"""Every write of the portal's references and challenges: queueing a release's reference run on reference
hardware, drawing a certify attempt's challenge at dispatch, the judge the verdicts call for the align
end-to-end part and the eval stage, and re-judging a release's stored results when its reference arrives."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.catalog.models import Hardware, ModelRelease
from apps.core.errors import ConflictError
from apps.jobs.choices import ACTIVE_STATES, JobPurpose
from apps.jobs.models import Job
from apps.jobs.services import do_create_job
from apps.references.models import Challenge, ReferenceRun, ReferenceState
from contract import thresholds as th
from contract.challenges import pool as cp
from contract.challenges import scoring as cs
from contract.challenges.verdicts import ChallengeJudge

logger = logging.getLogger(__name__)

E2E_SAMPLE = 8  # prompts per challenge (the pool holds 48)
REFERENCE_NEEDLE_SAMPLES = 2  # needles per (length, depth) of a reference run: its accuracy per length is the bar
CHALLENGE_STAGES = frozenset({"align", "eval"})
REFERENCE_STAGES = ["load", "reference"]
MIN_ITEMS = 20  # an accuracy sample is never smaller, whatever the power rule says


class NoReferenceHardware(ConflictError):
    """No hardware is marked ``reference``: nothing can compute a reference."""


def reference_hardware() -> Hardware | None:
    """The staff-operated hardware reference runs go to (the first marked ``reference``)."""
    return Hardware.objects.filter(reference=True).order_by("slug").first()


def finished_reference(release_id: int, pool_version: str) -> ReferenceRun | None:
    """The newest finished reference of a release for a pool version."""
    return (ReferenceRun.objects.filter(release_id=release_id, pool_version=pool_version,
                                        state=ReferenceState.FINISHED).order_by("-finished_at", "-id").first())


def _settle_abandoned(runs: Iterable[ReferenceRun]) -> list[ReferenceRun]:
    """Queued runs whose job finished without a reference become failed; returns the ones still active."""
    active = []
    for run in runs:
        job = run.job
        if job is not None and job.state in ACTIVE_STATES:
            active.append(run)
            continue
        error = f"job {job.pk} ended {job.state} without a reference section" if job else "its job was deleted"
        ReferenceRun.objects.filter(pk=run.pk, state=ReferenceState.QUEUED).update(state=ReferenceState.FAILED,
                                                                                    error=error)
    return active


@transaction.atomic
def do_queue_reference(release: ModelRelease, *, source: str | None = None, requested_by_id: int | None = None,
                       again: bool = False) -> ReferenceRun:
    """Queues a reference run of ``release`` for the current pool version (stages load and reference, fp32, on
    reference hardware, reading ``source`` or the release's ``reference_source``). Without ``again`` a queued or
    finished run of the same source and pool version is returned instead of a new one."""
    source = (source if source is not None else release.reference_source or "").strip()
    if not source:
            raise ValidationError({"model_path": "the weights source the reference host reads is required (the release "
                                             "has no reference_source)"})
    hardware = reference_hardware()
    if hardware is None:
        raise NoReferenceHardware("no hardware is marked reference: staff mark one (the seeded cpu host) first")
    version = cp.pool().version
    if not again:
        runs = ReferenceRun.objects.filter(release=release, pool_version=version, source=source).select_related("job")
        if runs.filter(state=ReferenceState.FINISHED).exists():
            return runs.filter(state=ReferenceState.FINISHED).first()
        active = _settle_abandoned(runs.filter(state=ReferenceState.QUEUED))
        if active:
            return active[0]
    job = do_create_job(model=release, hardware=hardware, organization_id=release.organization_id,
                        requested_by_id=requested_by_id,
                        spec={"stages": list(REFERENCE_STAGES), "dtype": "float32", "model_path": source},
                        purpose=JobPurpose.REFERENCE)
    needles = cp.needle_items(cp.needle_lengths(release.context_length), samples=REFERENCE_NEEDLE_SAMPLES)
    return ReferenceRun.objects.create(release=release, pool_version=version, source=source, job=job,
                                       needles=needles)


def ensure_references(releases: Iterable[ModelRelease] | None = None) -> list[ReferenceRun]:
    """Queues a reference run for every release (of ``releases``, default all) with a ``reference_source`` and
    no queued or finished run of the current pool version from that source; returns the runs queued. Without
    reference hardware nothing is queued (logged)."""
    if reference_hardware() is None:
        logger.warning("no reference hardware: no reference run queued")
        return []
    rows = releases if releases is not None else ModelRelease.objects.exclude(reference_source="")
    queued = []
    version = cp.pool().version
    for release in rows:
        if not release.reference_source:
            continue
        before = set(ReferenceRun.objects.filter(release=release, pool_version=version).values_list("pk", flat=True))
        run = do_queue_reference(release)
        if run.pk not in before:
            queued.append(run)
    return queued


# --- challenges ---------------------------------------------------------------------------------------------------

def reference_accuracy(reference: ReferenceRun | None, kind: str) -> tuple[float, str]:
    """The reference's accuracy over the whole pool for ``kind`` (mc, qa): the p0 of the power rule. Without a
    finished reference: 0.5, the largest variance (the most items)."""
    outputs = (reference.outputs or {}).get(kind) if reference else None
    if not outputs:
        return 0.5, "no finished reference yet: p0 = 0.5, the largest variance"
    pool = cp.pool()
    hits, n = 0, 0
    for item_id, out in outputs.items():
        key = pool.answers.get(kind, {}).get(item_id)
        if key is None:
            continue
        n += 1
        if kind == "mc":
            hits += cs.argmax([float(x) for x in out["loglikelihoods"]]) == key["answer"]
        else:
            item = pool.items[kind][item_id]
            hits += cs.qa_correct(str(out["text"]), item["until"], key["answer"], key.get("options") or {})
    return (hits / n, f"the reference's accuracy over the pool ({hits}/{n})") if n else (0.5, "no scored item")


@transaction.atomic
def draw_challenge(job: Job) -> Challenge | None:
    """Draws (with ``secrets``) this attempt's challenge of a certify job that runs align or eval, bound to its
    nonce: end-to-end prompts for align; multiple-choice and short-answer items sized by the power rule, the
    perplexity documents, fresh needles, and fixed samples of HumanEval problems and agent_kv episodes
    (``challenge_code_items``, ``challenge_agent_episodes``) for eval. Replaces a challenge of the same attempt (a
    dispatch the broker refused). None for other jobs."""
    stages = set(job.stages)
    if job.purpose != JobPurpose.CERTIFY or not stages & CHALLENGE_STAGES or not job.nonce:
        return None
    pool, rng = cp.pool(), secrets.SystemRandom()
    t = th.merged(job.spec.get("thresholds"))
    reference = finished_reference(job.model_id, pool.version)
    items: dict[str, Any] = {"nonce": job.nonce, "top_k": cp.TOP_K}
    keys: dict[str, dict[str, Any]] = {}
    sizes: dict[str, dict[str, Any]] = {}

    def take(kind: str, n: int) -> None:
        ids = sorted(rng.sample(pool.ids(kind), n))
        items[kind] = pool.agent_items(kind, ids)
        keys[kind] = {i: dict(pool.answers[kind][i]) for i in ids}

    if "align" in stages:
        n = min(E2E_SAMPLE, len(pool.ids("e2e")))
        take("e2e", n)
        sizes["e2e"] = {"n": n, "pool": len(pool.ids("e2e")), "rule": f"a fixed sample of {E2E_SAMPLE} prompts"}
    if "eval" in stages:
        for kind in ("mc", "qa"):
            p0, origin = reference_accuracy(reference, kind)
            size = cs.sample_size(p0, t["challenge_theta"], t["challenge_alpha"], t["challenge_beta"],
                                  pool=len(pool.ids(kind)), minimum=MIN_ITEMS)
            take(kind, size["n"])
            sizes[kind] = {**size, "p0_from": origin, "minimum": MIN_ITEMS}
        take("ppl", len(pool.ids("ppl")))
        sizes["ppl"] = {"n": len(pool.ids("ppl")), "pool": len(pool.ids("ppl")), "rule": "every document"}
        needles = cp.needle_items(cp.needle_lengths(job.model.context_length))
        items["needle"], keys["needle"] = needles, cp.needle_answers(needles)
        sizes["needle"] = {"n": len(needles), "rule": f"one fresh needle per length and depth {list(cp.NEEDLE_DEPTHS)}"}
        for kind, key in (("code", "challenge_code_items"), ("agent", "challenge_agent_episodes")):
            n = min(int(t[key]), len(pool.ids(kind)))
            if n:
                take(kind, n)
                sizes[kind] = {"n": n, "pool": len(pool.ids(kind)),
                               "rule": f"a fixed sample of {key} ({int(t[key])}), capped at the pool"}
    items["sizes"] = {kind: {"n": s["n"], "rule": s["rule"]} for kind, s in sizes.items()}
    challenge, _ = Challenge.objects.update_or_create(
        job=job, attempt=job.attempts,
        defaults={"nonce": job.nonce, "pool_version": pool.version, "items": items, "keys": keys, "sizes": sizes})
    return challenge


def challenge_judge(job: Job, *, attempt: int | None = None) -> ChallengeJudge | None:
    """The judge of a certify job's raw outputs: the current attempt's challenge (raw outputs of an earlier
    attempt answer another challenge); judging stored results again, ``attempt``'s (the one they were posted
    under); its keys, and the release's finished reference for that pool version. None for
    a reference job (nothing of it is judged against a reference) and for synthetic evidence (``seed_evidence``:
    no agent, marked synthetic everywhere), which is judged from its own numbers."""
    if job.purpose != JobPurpose.CERTIFY or job.spec.get("seeded"):
        return None
    challenges = Challenge.objects.filter(job_id=job.pk)
    if attempt is not None:
        challenge = challenges.filter(attempt=attempt).first()
    else:
        challenge = challenges.filter(attempt=job.attempts, nonce=job.nonce).first()
    if challenge is None:
        return ChallengeJudge(challenge=None)
    reference = finished_reference(job.model_id, challenge.pool_version)
    awaiting = "awaiting reference: the release has no finished reference run"
    if reference is None:
        pending = ReferenceRun.objects.filter(release_id=job.model_id, pool_version=challenge.pool_version,
                                              state=ReferenceState.QUEUED).first()
        if pending is not None:
            awaiting = f"awaiting reference: its reference run (job {pending.job_id}) has not finished"
    return ChallengeJudge(challenge=challenge.items, keys=challenge.keys, sizes=challenge.sizes,
                          reference=reference.outputs if reference else None, awaiting=awaiting,
                          reruns=challenge.reruns or {})
