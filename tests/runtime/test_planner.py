"""The planner's byte arithmetic, plan rules and choice, on real public configs and the hardware catalog."""

from __future__ import annotations

import time

import pytest

from contract.hardware import find_config, get_hardware, load_catalog, load_model_catalog
from contract.model.params import count_params
from contract.model.spec import parse_config
from contract.planner import PlanSettings, kv_bytes_per_token, normalize_dtype, plan_report, weight_bytes

CATALOG = {row["slug"]: row["config"] for row in load_model_catalog()}
H100, H200 = get_hardware("nvidia-h100-sxm"), get_hardware("nvidia-h200")
GQA_60 = {"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 8192, "num_hidden_layers": 60,
          "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 22016,
          "max_position_embeddings": 32768}


def plan(slug_or_config: str | dict, hw=H100, **kw) -> dict:
    config = CATALOG.get(slug_or_config) or find_config(slug_or_config) if isinstance(slug_or_config, str) \
        else slug_or_config
    return plan_report(config, memory_bytes=hw.memory_bytes, devices_per_node=hw.devices_per_node, **kw)


def test_kv_bytes_per_token_of_60_layers_8_kv_heads_128_dim_bf16() -> None:
    spec = parse_config(GQA_60)
    assert kv_bytes_per_token(spec, "bfloat16") == 245_760
    assert kv_bytes_per_token(spec, "float32") == 491_520
    assert plan(GQA_60)["kv_bytes_per_token"] == 245_760


def test_mla_kv_is_the_compressed_latent() -> None:
    assert kv_bytes_per_token(parse_config(CATALOG["deepseek-v3"]), "bf16") == 61 * (512 + 64) * 2


def test_sliding_window_layers_cost_no_per_token_kv() -> None:
    assert kv_bytes_per_token(parse_config(CATALOG["gpt-oss-120b"])) == 18 * 2 * 8 * 64 * 2


def test_weight_bytes_per_dtype() -> None:
    counts = count_params(parse_config(CATALOG["llama-3.1-8b"]))
    n = counts.total
    assert weight_bytes(counts, "bfloat16") == 2 * n
    assert weight_bytes(counts, "float32") == 4 * n
    linear = sum(layer.quantizable for layer in counts.layers)
    rest = n - linear  # embeddings, head, norms stay 16-bit when quantised
    assert weight_bytes(counts, "int8") == linear + 2 * rest
    assert weight_bytes(counts, "int4") == int(linear * (4 + 16 / 128) / 8 + 2 * rest)
    assert weight_bytes(counts, "int8") < weight_bytes(counts, "fp8") < weight_bytes(counts, "bf16")


def test_auto_dtype_is_the_checkpoint_format() -> None:
    oss = plan("gpt-oss-120b", dtype="auto")  # MXFP4 experts, bf16 attention: one 80 GB GPU (as published)
    assert oss["dtype"] == "mxfp4" and oss["plan"]["devices"] == 1
    assert 60e9 < oss["weight_bytes"] < 70e9  # the published checkpoint is about 65 GB
    v3 = plan("deepseek-v3", H200, dtype="auto")
    assert v3["dtype"] == "float8_e4m3fn" and v3["plan"]["devices"] == 8
    assert plan("qwen3-32b", dtype="auto")["dtype"] == "bfloat16"


def test_unknown_dtype_is_named() -> None:
    with pytest.raises(ValueError, match="'int3'"):
        normalize_dtype("int3")


def test_report_has_the_contract_keys() -> None:
    report = plan("llama-3.1-8b")
    for key in ("params_total", "params_active", "weight_bytes", "kv_bytes_per_token", "plan", "fits",
                "bytes_per_device", "memory_per_device", "dtype", "max_context", "max_batch", "candidates"):
        assert key in report, key
    assert set(report["plan"]) >= {"tp", "pp", "ep", "devices"}
    assert report["fits"] and report["plan"]["devices"] == 1 and report["max_context"] == 131072


@pytest.mark.parametrize("slug", sorted(CATALOG) + ["synthetic-3t-moe"])
@pytest.mark.parametrize("dtype", ["bfloat16", "fp8"])
def test_chosen_plan_is_the_smallest_valid_fitting_plan(slug: str, dtype: str) -> None:
    report = plan(slug, dtype=dtype)
    spec = parse_config(CATALOG.get(slug) or find_config(slug))
    chosen = report["plan"]
    if report["runtime"]["path"] == "fallback":  # gpt-oss: the transformers fallback runs it, on one device only
        assert chosen == {"tp": 1, "pp": 1, "ep": 1, "devices": 1, "nodes": 1} and len(report["candidates"]) == 1
        assert report["fits"] or report["message"].startswith("does not fit one device: ")
        return
    assert report["fits"]
    assert chosen["devices"] * report["usable_per_device"] >= report["weight_bytes"]
    assert report["bytes_per_device"] <= report["usable_per_device"] <= report["memory_per_device"]
    assert all(not c["fits"] for c in report["candidates"] if c["devices"] < chosen["devices"])
    for c in report["candidates"]:
        assert c["tp"] <= 8 and spec.num_attention_heads % c["tp"] == 0
        assert c["ep"] == 1 or spec.num_experts % c["ep"] == 0
        assert c["devices"] == c["pp"] * max(c["tp"], c["ep"])
    assert 0 < report["max_context"] <= spec.context_length and report["max_batch"] >= 1


def test_known_deployments() -> None:
    assert plan("llama-3.1-70b", dtype="bf16")["plan"]["devices"] == 2  # 141 GB of weights on 2 x 80 GB
    assert plan("deepseek-v3", H200, dtype="fp8")["plan"]["devices"] <= 8  # one H200 node runs V3 in fp8
    assert plan("mixtral-8x7b", dtype="fp8")["plan"]["devices"] == 1


def test_more_memory_never_shrinks_the_kv_pool() -> None:
    small = plan_report(CATALOG["qwen3-32b"], memory_bytes=80 << 30, devices_per_node=8, tp=2)
    large = plan_report(CATALOG["qwen3-32b"], memory_bytes=160 << 30, devices_per_node=8, tp=2)
    assert large["kv_tokens"] > small["kv_tokens"] and large["max_batch"] >= small["max_batch"]


def test_model_that_does_not_fit_says_by_how_much() -> None:
    report = plan("llama-3.1-405b", max_nodes=1)
    assert not report["fits"] and report["plan"]["devices"] == 8
    assert report["shortfall_bytes"] == report["bytes_per_device"] - report["usable_per_device"] > 0
    assert "short by" in report["message"] and "GiB" in report["message"]


def test_pinned_degrees_are_honoured_or_refused() -> None:
    assert plan("llama-3.1-70b", tp=4)["plan"]["tp"] == 4
    assert plan("qwen3-235b-a22b", ep=8, tp=8)["plan"] == {"tp": 8, "pp": 1, "ep": 8, "devices": 8, "nodes": 1}
    bad = plan("llama-3.1-8b", tp=3)  # 32 heads are not divisible by 3
    assert bad["plan"] is None and not bad["fits"] and "divisibility" in bad["message"]


def test_shared_memory_devices_split_the_host() -> None:
    tiny = {**GQA_60, "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
            "head_dim": 32}
    one = plan_report(tiny, memory_bytes=8 << 30, devices_per_node=1, shared_memory=True, dtype="float32")
    two = plan_report(tiny, memory_bytes=8 << 30, devices_per_node=1, shared_memory=True, dtype="float32", tp=2)
    assert one["plan"]["devices"] == 1 and two["plan"]["devices"] == 2
    assert two["memory_per_device"] == one["memory_per_device"] // 2


def test_unknown_architecture_still_plans_with_a_warning() -> None:
    report = plan({**GQA_60, "num_hidden_layers": 8, "architectures": ["FrobForCausalLM"]})  # ~10 B parameters
    assert report["fits"] and report["family"] == "unknown" and report["warnings"]
    assert report["plan"]["devices"] == 1 and report["runtime"]["path"] == "fallback"  # the fallback's one device


def test_fp8_on_hardware_without_fp8_warns() -> None:
    a100 = get_hardware("nvidia-a100-sxm-80gb")
    report = plan("llama-3.1-8b", a100, dtype="fp8", hardware_dtypes=a100.dtypes)
    assert any("float8_e4m3fn" in w for w in report["warnings"])


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="headroom"):
        PlanSettings(headroom=1.5)


def test_hardware_catalog_has_the_real_accelerators() -> None:
    catalog = load_catalog()
    for slug in ("nvidia-h100-sxm", "nvidia-h200", "nvidia-b200", "amd-mi300x", "amd-mi325x", "intel-gaudi3",
                 "huawei-ascend-910b", "google-tpu-v5p"):
        hw = catalog[slug]
        assert hw.memory_bytes > 32 << 30 and hw.devices_per_node >= 4 and hw.peak_tflops["bfloat16"] > 100
        assert type(hw).from_dict(hw.to_dict()) == hw
    cpu = get_hardware("cpu")
    assert cpu.memory_bytes > 1 << 30 and cpu.shared_memory
    with pytest.raises(KeyError, match="no-such-chip"):
        get_hardware("no-such-chip")


def test_dense_plan_is_fast() -> None:
    config = CATALOG["llama-3.1-70b"]
    plan_report(config, memory_bytes=H100.memory_bytes, devices_per_node=8)
    best = min(_timed(config) for _ in range(5))
    assert best < 0.05  # well under 10 ms on a quiet machine; loose here because the CPUs are shared


def _timed(config: dict) -> float:
    t0 = time.perf_counter()
    plan_report(config, memory_bytes=H100.memory_bytes, devices_per_node=8)
    return time.perf_counter() - t0
