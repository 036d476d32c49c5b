"""What the agent's task hands the pipeline: never the release's manifest (the portal compares the digests the
load reports), and the portal's weight challenge of the attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.worker.agent_state import STATE
from agents.worker.job_context import build_context

MANIFEST = [{"name": "model-00001-of-00001.safetensors", "size": 1024, "sha256": "ab" * 32}]


@pytest.fixture
def spec(tmp_path: Path, monkeypatch) -> dict:  # noqa: ANN001
    monkeypatch.setattr(STATE, "work_root", str(tmp_path))
    return {"stages": ["plan"], "dtype": "float32", "model": {"slug": "m", "config": {"architectures": ["X"]}},
            "hardware": {"slug": "cpu", "memory_bytes": 8 * 10**9}}


def test_a_manifest_in_the_delivery_does_not_reach_the_stage_context(spec: dict) -> None:
    ctx = build_context(7, {**spec, "manifest": MANIFEST}, lambda *a, **k: None)
    assert ctx.manifest is None and ctx.workdir.is_dir()


def test_the_weight_challenge_reaches_the_stage_context(spec: dict) -> None:
    probe = {"nonce": "n" * 32, "probes": [{"file": "model.safetensors", "offset": 8, "length": 64}]}
    samples = {"count": 2, "length": 64, "positions": [0.25, 0.5]}
    ctx = build_context(7, {**spec, "weight_probe": probe, "weight_samples": samples}, lambda *a, **k: None)
    assert ctx.weight_probe == probe and ctx.weight_samples == samples


def test_a_malformed_weight_challenge_fails_the_job_naming_it(spec: dict) -> None:
    with pytest.raises(ValueError, match="job 7: the delivery's weight_probe must be an object"):
        build_context(7, {**spec, "weight_probe": ["model.safetensors"]}, lambda *a, **k: None)


def test_the_challenge_pool_nonce_and_purpose_reach_the_stage_context(spec: dict) -> None:
    challenge = {"nonce": "n", "e2e": [{"id": "e2e-1", "prompt": "Hi", "chat": False, "max_tokens": 4}]}
    pool = {"version": "v", "mc": []}
    ctx = build_context(7, {**spec, "nonce": "n", "purpose": "certify", "challenge": challenge}, lambda *a, **k: None)
    assert ctx.challenge == challenge and ctx.nonce == "n" and ctx.purpose == "certify" and ctx.reference_pool is None
    ctx = build_context(7, {**spec, "purpose": "reference", "reference_pool": pool}, lambda *a, **k: None)
    assert ctx.reference_pool == pool and ctx.purpose == "reference" and ctx.challenge is None and ctx.nonce is None
    assert build_context(7, spec, lambda *a, **k: None).purpose == "certify"  # a spec from before purposes
    with pytest.raises(ValueError, match="job 7: the delivery's challenge must be an object, got list"):
        build_context(7, {**spec, "challenge": [challenge]}, lambda *a, **k: None)
