"""The load verdict (pure: no Django, no torch); the manifest rule it compares with is ``contract.manifest``.

A load is compared only with a manifest the release's publisher gave (``given``), staff set (``staff``) or the
reference run's load recorded (``reference``): never with digests a vendor's load reported, so one vendor's
bogus digests cannot fail another vendor's honest load. Without such a manifest the load passes on its own
problems and tensor count, with the note "no publisher manifest: digests not verified".

The weight probe proves the agent read the bytes it claims: the portal sends byte ranges of each shard that a
reference run sampled (``Context.weight_probe``: the job's nonce and the expected
``sha256(nonce + bytes)`` of each range); the load section answers them (``weight_probe``) and any answer
that differs fails the load naming the shard. A probe sent but not answered is incomplete."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.manifest import LEGACY_SOURCES, manifest_mismatches
from contract.verdicts.base import INCOMPLETE, Context, Verdict


def _manifest(v: Verdict, shards: list[Any], ctx: Context) -> None:
    manifest, source = ctx.model.manifest, ctx.model.manifest_source
    if manifest and source not in LEGACY_SOURCES:
        for mismatch in manifest_mismatches(shards, manifest):
            v.fail(mismatch)
        return
    if manifest:  # a vendor's digests recorded before: shown, compared for information, never failing a load
        differ = manifest_mismatches(shards, manifest)
        v.note("the release's manifest was first seen on a vendor's load (legacy), not given by the publisher, "
               "staff or the reference run: digests not verified" + (f"; they differ from it: {differ[0]}"
                                                                      if differ else ""))
        return
    v.note("no publisher manifest: digests not verified")


def _probe_key(row: Mapping[str, Any]) -> tuple[str, Any, Any]:
    return str(row.get("file")), row.get("offset"), row.get("length")


def _weight_probe(v: Verdict, s: Mapping[str, Any], ctx: Context) -> None:
    """The agent's ``weight_probe`` answers against the portal's expected hashes (``ctx.weight_probe``)."""
    facts = ctx.weight_probe
    if facts is None:  # judged without the portal's facts (the pipeline's own claim)
        return
    expected = facts.get("probes") or []
    if not expected:
        v.note(f"weight probe not checked: {facts.get('reason') or 'no reference samples'}")
        return
    answers = s.get("weight_probe")
    if isinstance(answers, Mapping):  # a stored section holds only a count: the portal kept the answers
        answers = facts.get("answers")
    if not isinstance(answers, list) or not answers:
        v.missing(f"weight probe not answered: {len(expected)} byte range(s) of the weights were asked")
        return
    given = {_probe_key(a): a for a in answers if isinstance(a, Mapping)}
    wrong: dict[str, list[Any]] = {}
    missing: dict[str, list[Any]] = {}
    for probe in expected:
        answer = given.get(_probe_key(probe))
        file = str(probe.get("file"))
        if answer is None:
            missing.setdefault(file, []).append(probe.get("offset"))
        elif str(answer.get("sha256") or "").lower() != str(probe.get("sha256")).lower():
            wrong.setdefault(file, []).append(probe.get("offset"))
    for file, offsets in wrong.items():
        v.fail(f"shard {file}: weight probe at offset {offsets[0]}" + (f" (and {len(offsets) - 1} more)"
                                                                        if len(offsets) > 1 else "")
               + " does not match the reference's bytes hashed with this job's nonce")
    for file, offsets in missing.items():
        v.missing(f"shard {file}: weight probe at offset {offsets[0]}" + (f" (and {len(offsets) - 1} more)"
                                                                           if len(offsets) > 1 else "")
                  + " not answered")


def _load(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    shards = s.get("shards")
    tensors = s.get("tensors")
    problems = s.get("problems")
    if not isinstance(shards, list) or not shards:
        v.missing("shards missing: no checksum of any weight file")
    elif any(not (isinstance(x, Mapping) and isinstance(x.get("sha256"), str) and len(x["sha256"]) == 64)
             for x in shards):
        v.missing("a shard has no sha256 digest")
    if not isinstance(tensors, int) or isinstance(tensors, bool) or tensors <= 0:
        v.missing("tensors (the count loaded and verified) missing")
    elif ctx.model.declared_tensors is not None and tensors != ctx.model.declared_tensors:
        v.fail(f"{tensors} tensors loaded, the model declares {ctx.model.declared_tensors}")
    if problems is None:
        v.missing("problems missing (an empty list when every tensor verified)")
    elif not isinstance(problems, list):
        v.missing("problems must be a list")
    elif problems:
        first = problems[0] if isinstance(problems[0], Mapping) else {}
        v.fail(f"{len(problems)} problem(s), first {first.get('tensor') or first.get('file')}: {first.get('problem')}")
    if v.status == INCOMPLETE or not isinstance(shards, list):
        return
    _manifest(v, shards, ctx)
    _weight_probe(v, s, ctx)
