"""Weight probes through the REST API with real agent tokens: the reference run's samples are stored and never
readable with an agent token; a certify job's probe answers are checked against them with the attempt's nonce
(wrong or replayed answers fail naming the shard, missing ones are incomplete). The answers are computed by the
agent's own code (``agents.pipeline.support.weight_probe``) over real files."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from agents.pipeline.support.weight_probe import answer_challenge
from apps.evidence.models import StageResult, WeightDraw, WeightSamples
from apps.jobs.choices import JobPurpose
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token
from tests.portal.test_manifests import SHARDS, dispatched, post_load, vendor

pytestmark = pytest.mark.django_db


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    """Two shards: one of 5,000 random bytes, one shorter than a sample (40 bytes)."""
    for name, size in zip(SHARDS, (5000, 40), strict=True):
        (tmp_path / name).write_bytes(os.urandom(size))
    return tmp_path


def load_of(weights: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """The load section an honest agent posts: its shards' digests and sizes, and its challenge answered."""
    section = {"ok": True, "tensors": 201, "problems": [], "shards": [
        {"file": name, "sha256": hashlib.sha256((weights / name).read_bytes()).hexdigest(),
         "size": (weights / name).stat().st_size} for name in SHARDS]}
    answer_challenge(weights, section, payload.get("weight_samples"), payload.get("weight_probe"))
    return section


@pytest.fixture
def sampled(api_client, weights: Path) -> tuple[Any, Path, dict[str, Any]]:
    """A release whose reference run has posted its load with the weight samples."""
    model = ModelReleaseFactory()
    reference = HardwareFactory(reference=True)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=reference)
    job, payload = dispatched(model, reference, JobPurpose.REFERENCE)
    spec = payload["weight_samples"]
    assert "weight_probe" not in payload and spec["count"] == len(spec["positions"]) == 16 and spec["length"] == 64
    assert all(0 <= x < 1 for x in spec["positions"])
    section = load_of(weights, payload)
    body = post_load(api_client, job, token, section)
    assert body["stored"][0]["verdict"] == "pass", body
    return model, weights, {"job": job, "token": token, "section": section}


def test_the_reference_runs_samples_are_stored_and_never_readable_with_an_agent_token(api_client, sampled) -> None:
    model, weights, ref = sampled
    rows = {row.file: row for row in WeightSamples.objects.filter(model=model)}
    assert set(rows) == set(SHARDS)
    for name, row in rows.items():
        data = (weights / name).read_bytes()
        assert len(row.samples) == 16 and all(bytes.fromhex(h) == data[o:o + 64] for o, h in row.samples)
    secrets_ = [s["bytes_b64"] for shard in ref["section"]["weight_samples"] for s in shard["samples"]]
    secrets_ += [h for row in rows.values() for _, h in row.samples]
    stored = StageResult.objects.get(job=ref["job"], stage="load").section
    assert stored["weight_samples"] == {"shards": 2, "samples": 32, "kept": "by the portal (secret)"}
    hardware, token = vendor()
    job, payload = dispatched(model, hardware)
    for reader in (ref["token"], token):
        for url in (f"/api/v1/jobs/{ref['job'].pk}/", f"/api/v1/cells/{model.slug}/{ref['job'].hardware.slug}/",
                    f"/api/v1/models/{model.slug}/", f"/api/v1/jobs/{ref['job'].pk}/events/"):
            text = api_client.get(url, **auth(reader)).content.decode()
            assert not any(secret in text for secret in secrets_ if len(secret) >= 16), url
    assert not any(secret in str(payload) for secret in secrets_ if len(secret) >= 16)


def test_samples_from_a_certify_job_or_at_other_offsets_are_refused_naming_the_path(api_client, sampled) -> None:
    model, weights, ref = sampled
    hardware, token = vendor()
    job, payload = dispatched(model, hardware)
    section = {**load_of(weights, payload), "weight_samples": ref["section"]["weight_samples"]}
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", {"stage": "load", "section": section,
                                                                   "attempt": job.attempts, "nonce": job.nonce},
                               format="json", **auth(token))
    assert response.status_code == 400 and "stages.load.weight_samples" in response.json(), response.content
    again, payload = dispatched(model, ref["job"].hardware, JobPurpose.REFERENCE)
    section = load_of(weights, payload)
    section["weight_samples"][0]["samples"][3]["offset"] += 1
    response = api_client.post(f"/api/v1/jobs/{again.pk}/results/", {"stage": "load", "section": section,
                                                                     "attempt": again.attempts, "nonce": again.nonce},
                               format="json", **auth(ref["token"]))
    assert response.status_code == 400 and "stages.load.weight_samples[0].samples[3].offset" in response.json()
    assert WeightSamples.objects.filter(model=model, job=ref["job"]).count() == 2  # nothing lost


def test_a_certify_load_answers_its_probe_and_wrong_replayed_or_missing_answers_do_not_pass(api_client,
                                                                                           sampled) -> None:
    model, weights, _ = sampled
    hardware, token = vendor()
    job, payload = dispatched(model, hardware)
    probe = payload["weight_probe"]
    assert probe["nonce"] == job.nonce and "manifest" not in payload
    stored = {row.file: {o for o, _ in row.samples} for row in WeightSamples.objects.filter(model=model)}
    assert {p["file"] for p in probe["probes"]} == set(SHARDS)
    assert all(p["offset"] in stored[p["file"]] and "hex" not in p for p in probe["probes"])
    honest = load_of(weights, payload)
    body = post_load(api_client, job, token, honest)
    assert body["stored"][0]["verdict"] == "pass" and body["stored"][0]["reasons"] == []
    assert StageResult.objects.get(job=job, stage="load").section["weight_probe"]["answers"] == len(probe["probes"])
    assert WeightDraw.objects.get(job=job, attempt=job.attempts).answers == honest["weight_probe"]

    wrong = load_of(weights, payload)
    wrong["weight_probe"][0]["sha256"] = "0" * 64
    StageResult.objects.filter(job=job, stage="load").delete()  # a stage is posted once per attempt
    body = post_load(api_client, job, token, wrong)
    first = wrong["weight_probe"][0]
    assert body["stored"][0]["verdict"] == "fail"
    assert (f"load: shard {first['file']}: weight probe at offset {first['offset']} does not match the reference's "
            "bytes hashed with this job's nonce") in body["stored"][0]["reasons"]

    other, other_payload = dispatched(model, hardware)
    assert other.nonce != job.nonce
    # answers hashed with the first job's nonce (a replay of its answers), for this job's byte ranges
    replayed = load_of(weights, {"weight_probe": {**other_payload["weight_probe"], "nonce": job.nonce}})
    body = post_load(api_client, other, token, replayed)
    assert body["stored"][0]["verdict"] == "fail"
    assert any("does not match the reference's bytes hashed with this job's nonce" in r
               for r in body["stored"][0]["reasons"])

    missing = load_of(weights, other_payload)
    del missing["weight_probe"]
    StageResult.objects.filter(job=other, stage="load").delete()
    body = post_load(api_client, other, token, missing)
    assert body["stored"][0]["verdict"] == "incomplete"
    assert any("weight probe not answered" in r for r in body["stored"][0]["reasons"])


def test_without_reference_samples_the_load_says_the_probe_was_not_checked(api_client, weights: Path) -> None:
    model = ModelReleaseFactory()
    hardware, token = vendor()
    job, payload = dispatched(model, hardware)
    assert "weight_probe" not in payload and "weight_samples" not in payload
    post_load(api_client, job, token, load_of(weights, payload))
    notes = api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/").json()["evidence"]["stages"]["load"]
    assert notes["verdict"] == "pass" and "load: weight probe not checked: no reference samples" in notes["notes"]


def test_sampling_reads_the_bytes_at_the_positions_the_portal_chose(weights: Path) -> None:
    from agents.pipeline.support.weight_probe import sample_shards

    shards = sample_shards(weights, SHARDS, {"count": 2, "length": 64, "positions": [0.0, 0.5]})
    big, small = (weights / SHARDS[0]).read_bytes(), (weights / SHARDS[1]).read_bytes()
    assert shards[0]["size"] == 5000 and [s["offset"] for s in shards[0]["samples"]] == [0, (5000 - 64) // 2]
    assert base64.b64decode(shards[0]["samples"][1]["bytes_b64"]) == big[2468:2532]
    assert [base64.b64decode(s["bytes_b64"]) for s in shards[1]["samples"]] == [small, small]  # shorter than L


def test_a_stored_load_is_judged_again_with_the_answers_the_portal_kept(api_client, sampled) -> None:
    from apps.evidence.judging import judging_context
    from contract import verdicts

    model, weights, _ = sampled
    hardware, token = vendor()
    job, payload = dispatched(model, hardware)
    post_load(api_client, job, token, load_of(weights, payload))
    stored = StageResult.objects.get(job=job, stage="load").section
    assert isinstance(stored["weight_probe"], dict)  # a count: the answers are not in the stored section
    assert verdicts.judge("load", stored, context=judging_context(job)).status == "pass"
    WeightDraw.objects.filter(job=job).update(answers=[{**a, "sha256": "0" * 64} for a in
                                                       WeightDraw.objects.get(job=job).answers])
    assert verdicts.judge("load", stored, context=judging_context(job)).status == "fail"
