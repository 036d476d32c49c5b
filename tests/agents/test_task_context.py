"""What the agent's task hands the pipeline: the release's checksum manifest from the job detail."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.worker.agent_state import STATE
from agents.worker.tasks import build_context

MANIFEST = [{"name": "model-00001-of-00001.safetensors", "size": 1024, "sha256": "ab" * 32}]


@pytest.fixture
def spec(tmp_path: Path, monkeypatch) -> dict:  # noqa: ANN001
    monkeypatch.setattr(STATE, "work_root", str(tmp_path))
    return {"stages": ["plan"], "dtype": "float32", "model": {"slug": "m", "config": {"architectures": ["X"]}},
            "hardware": {"slug": "cpu", "memory_bytes": 8 * 10**9}}


def test_the_job_details_manifest_reaches_the_stage_context(spec: dict) -> None:
    ctx = build_context(7, spec, lambda *a, **k: None, manifest=MANIFEST)
    assert ctx.manifest == MANIFEST and ctx.workdir.is_dir()
    assert build_context(7, {**spec, "manifest": MANIFEST}, lambda *a, **k: None).manifest == MANIFEST
    assert build_context(7, spec, lambda *a, **k: None, manifest=[]).manifest is None  # none known: first seen


def test_a_malformed_manifest_fails_the_job_naming_it(spec: dict) -> None:
    with pytest.raises(ValueError, match="job 7: the manifest must be a list"):
        build_context(7, spec, lambda *a, **k: None, manifest=["model.safetensors"])


def test_the_challenge_pool_nonce_and_purpose_reach_the_stage_context(spec: dict) -> None:
    challenge = {"nonce": "n", "e2e": [{"id": "e2e-1", "prompt": "Hi", "chat": False, "max_tokens": 4}]}
    pool = {"version": "v", "mc": []}
    ctx = build_context(7, {**spec, "nonce": "n", "purpose": "certify", "challenge": challenge}, lambda *a, **k: None)
    assert ctx.challenge == challenge and ctx.nonce == "n" and ctx.purpose == "certify" and ctx.reference_pool is None
    ctx = build_context(7, {**spec, "purpose": "reference", "reference_pool": pool}, lambda *a, **k: None)
    assert ctx.reference_pool == pool and ctx.purpose == "reference" and ctx.challenge is None and ctx.nonce is None
    assert build_context(7, spec, lambda *a, **k: None).purpose == "certify"  # a spec from before purposes
    with pytest.raises(ValueError, match="job 7: the spec's challenge must be an object, got list"):
        build_context(7, {**spec, "challenge": [challenge]}, lambda *a, **k: None)
