"""Deployable layouts: TP divides the heads and stays in a node, PP spans whole nodes, EP takes the experts,
several nodes are whole nodes; pinned degrees are checked against the same rules."""

from __future__ import annotations

import pytest

from contract.hardware import find_config, get_hardware, load_model_catalog
from contract.model.spec import parse_config
from contract.planner import plan_report
from contract.planner.search import LayoutError, check_layout, config_layout_error, layout_problem

CATALOG = {row["slug"]: row["config"] for row in load_model_catalog()}
H100, H200, B200 = (get_hardware(s) for s in ("nvidia-h100-sxm", "nvidia-h200", "nvidia-b200"))
CPU = get_hardware("cpu")


def _plan(slug: str, hw, **kw) -> dict:
    config = CATALOG.get(slug) or find_config(slug)
    return plan_report(config, memory_bytes=hw.memory_bytes, devices_per_node=hw.devices_per_node, **kw)


def test_llama_405b_on_h200_is_one_node_of_tp8_not_a_seven_stage_pipeline() -> None:
    bf16 = _plan("llama-3.1-405b", H200, dtype="bfloat16")["plan"]
    assert bf16["tp"] == 8 and bf16["devices"] in (8, 16) and bf16["devices"] % 8 == 0
    h100 = _plan("llama-3.1-405b", H100, dtype="bfloat16")["plan"]  # 810 GB does not fit 8 x 80 GB
    assert (h100["tp"], h100["pp"], h100["nodes"]) == (8, 2, 2)
    assert _plan("llama-3.1-405b", H200, dtype="fp8")["plan"]["pp"] == 1


@pytest.mark.parametrize("slug", sorted(CATALOG) + ["synthetic-3t-moe"])
@pytest.mark.parametrize("hw", [H100, H200, B200], ids=lambda h: h.slug)
def test_every_chosen_and_candidate_plan_is_deployable(slug: str, hw) -> None:
    spec = parse_config(CATALOG.get(slug) or find_config(slug))
    report = _plan(slug, hw, dtype="bfloat16")
    node = hw.devices_per_node
    for plan in [report["plan"], *report["candidates"]]:
        tp, pp, ep, devices = plan["tp"], plan["pp"], plan["ep"], plan["devices"]
        assert spec.num_attention_heads % tp == 0 and node % tp == 0  # TP divides the heads, inside a node
        assert pp == 1 or max(tp, ep) % node == 0  # pipeline stages are whole nodes
        assert devices <= node and node % devices == 0 or devices % node == 0  # whole nodes past one
        assert ep == 1 or spec.num_experts % ep == 0


def test_rules_are_named() -> None:
    llama8b = parse_config(CATALOG["llama-3.1-8b"])  # 32 heads, 8 KV heads
    assert "32 attention heads" in layout_problem(llama8b, H100, 3, 1, 1)
    assert "inside a node" in layout_problem(llama8b, H100, 16, 1, 1)
    assert "spans nodes" in layout_problem(llama8b, H100, 4, 2, 1)
    assert layout_problem(llama8b, H100, 8, 2, 1) is None
    assert layout_problem(llama8b, H100, 32, 1, 1) is not None
    assert "routed experts" in layout_problem(llama8b, H100, 1, 1, 2)
    moe96 = parse_config({**CATALOG["qwen3-30b-a3b"], "num_experts": 96})
    assert "6 devices must divide the 8" in layout_problem(moe96, H100, 1, 1, 6)
    assert "whole nodes" in layout_problem(moe96, H100, 1, 1, 12)
    assert layout_problem(moe96, H100, 1, 1, 16) is None  # EP may span nodes, in whole nodes
    assert "must divide the 96 routed experts" in layout_problem(moe96, H100, 1, 1, 64)
    assert layout_problem(llama8b, CPU, 2, 2, 1) is None  # CPU ranks share one host: no node to stay in
    kv_fewer = parse_config({**CATALOG["llama-3.1-8b"], "num_key_value_heads": 2})
    assert layout_problem(kv_fewer, H100, 8, 1, 1) is None  # KV heads replicated when fewer than tp


def test_pinned_degrees_raise_the_rule_and_free_ones_are_searched() -> None:
    llama8b = parse_config(CATALOG["llama-3.1-8b"])
    with pytest.raises(LayoutError, match="attention heads") as err:
        check_layout(llama8b, H100, tp=3)
    assert err.value.field == "tp"
    with pytest.raises(LayoutError, match="spans nodes") as err:
        check_layout(llama8b, H100, tp=4, pp=2)
    assert err.value.field == "pp"
    check_layout(llama8b, H100, pp=2)  # tp=8 makes each stage a node
    check_layout(llama8b, H100)
    assert config_layout_error(CATALOG["llama-3.1-8b"], H100, None, None, 4).field == "ep"
    assert config_layout_error({"not": "a config"}, H100, 3, None, None) is None  # the plan stage says why


def test_the_planner_refuses_a_pinned_layout_no_rule_allows() -> None:
    report = _plan("llama-3.1-70b", H100, tp=4, pp=2)
    assert report["plan"] is None and not report["fits"]
