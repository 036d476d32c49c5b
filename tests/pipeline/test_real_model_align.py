"""Alignment on real weights (SmolLM2-135M-Instruct): bf16 against fp32 layer by layer, where the large
activations of a few middle layers cost bf16 what random weights never show; end to end stops at EOS."""

from __future__ import annotations

import pytest

from agents.pipeline.runner import run_pipeline
from tests.real_model_fixtures import smollm2  # noqa: F401 - the session fixture

pytestmark = pytest.mark.slow


def test_bfloat16_layers_against_the_fp32_reference_on_real_weights(make_ctx, smollm2) -> None:  # noqa: F811
    ctx, _ = make_ctx(smollm2, dtype="bfloat16")
    report = run_pipeline(ctx, ["load", "align"])
    align = report["stages"]["align"]
    layers = align["layers"]
    assert len(layers) == 30 and all(row["dtype"] == "bfloat16" for row in layers)
    assert all(row["fp32_cosine"] > 0.99999 for row in layers)  # the runtime itself is exact in fp32
    worst = min(layers, key=lambda row: row["cosine"])
    assert 9 <= worst["layer"] <= 12 and worst["cosine"] < 0.997  # the large-activation layers
    assert all(row["cosine"] > 0.999 for row in layers[:9])
    assert all(row["status"] == "passed" for row in align["ops"]), [r for r in align["ops"] if not r["passed"]]
    e2e = align["e2e"]
    assert e2e["hard_divergences"] == 0 and e2e["eos_token_ids"]
    assert "eos_reference" in e2e["stopped"]  # an instruct model ends its chat answer
    assert e2e["tokens"] == sum(e2e["ref_tokens"])
