from __future__ import annotations

import math

import pytest
import torch

from agents.pipeline import align_ops
from agents.pipeline.base import StageContext, StageFailed
from agents.pipeline.report import ROW_KEYS

TINY_MOE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096}
OPS = ["matmul", "attention", "rms_norm", "rope", "softmax", "silu", "moe_routing", "moe_experts"]


def test_compare_defines_normwise_relative_error():
    ref = torch.tensor([1.0, -4.0, 0.0])
    out = torch.tensor([1.0, -4.0, 0.5])  # an error of 0.5 where the reference is 0
    m = align_ops.compare(ref, out)
    assert m["max_abs_err"] == pytest.approx(0.5)
    assert m["max_rel_err"] == pytest.approx(0.5 / 4.0)  # relative to max |ref|, not to the zero element
    assert m["cosine"] == pytest.approx(17 / math.sqrt(17 * 17.25))


def test_compare_flags_non_finite_target():
    m = align_ops.compare(torch.ones(3), torch.tensor([1.0, float("nan"), 1.0]))
    assert m["max_rel_err"] == float("inf") and math.isnan(m["cosine"])


def test_float32_cpu_matches_the_reference_on_every_operator():
    ops = align_ops.run_checks(TINY_MOE, dtype="float32")
    assert [op["op"] for op in ops] == OPS
    for op in ops:
        assert all(k in op for k in ROW_KEYS[("align", "ops")])
        assert op["passed"] and op["cosine"] > 0.99999 and op["max_rel_err"] < 1e-4, op


def test_bfloat16_is_within_default_thresholds_but_not_exact():
    ops = {op["op"]: op for op in align_ops.run_checks(TINY_MOE, dtype="bfloat16")}
    assert all(op["passed"] for op in ops.values()), ops
    assert ops["matmul"]["max_rel_err"] > 1e-4  # bf16 rounding is visible: the check measures something
    assert 0 < ops["moe_routing"]["topk_agreement"] <= 1


def test_thresholds_override_fails_operators():
    ctx = StageContext(model_dir=None, config=TINY_MOE, hardware={}, dtype="bfloat16",
                       thresholds={"op_max_rel_err": 1e-5}, emit_fn=lambda *a, **k: None)
    section = align_ops.run(ctx)
    assert section["thresholds"]["op_max_rel_err"] == 1e-5
    assert not section["passed"]
    assert not next(op for op in section["ops"] if op["op"] == "matmul")["passed"]


def test_dense_config_has_no_moe_checks_and_integer_dtype_is_refused():
    dense = {k: v for k, v in TINY_MOE.items() if k not in ("num_local_experts", "num_experts_per_tok")}
    assert [op["op"] for op in align_ops.run_checks(dense)] == OPS[:6]
    with pytest.raises(StageFailed, match="int8"):
        align_ops.run_checks(dense, dtype="int8")
