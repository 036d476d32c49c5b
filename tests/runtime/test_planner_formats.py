"""True bytes per quantised format (packed values + scales + zero points), the checkpoint's own format read from
its ``quantization_config``, and native vs emulated per hardware, against published checkpoint sizes."""

from __future__ import annotations

import copy

import pytest

from contract.hardware import get_hardware, load_model_catalog
from contract.model.params import count_params
from contract.model.spec import parse_config
from contract.planner import normalize_dtype, plan_report, resolve_dtype, weight_bytes
from contract.planner.formats import format_bits

CATALOG = {row["slug"]: row["config"] for row in load_model_catalog()}
H100, B200 = get_hardware("nvidia-h100-sxm"), get_hardware("nvidia-b200")
# Kimi-K2-Thinking's quantization_config (its config.json on the Hub): routed experts only, symmetric INT4 in
# groups of 32, attention, shared experts and the dense MLP left in bf16.
KIMI_K2_THINKING_QUANT = {
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
        "group_size": 32, "num_bits": 4, "strategy": "group", "symmetric": True, "type": "int", "dynamic": False}}},
    "format": "pack-quantized", "quant_method": "compressed-tensors", "quantization_status": "compressed",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"],
}
# Published checkpoint sizes (sum of the safetensors files): gpt-oss-120b 60.8 GiB = 65.3 GB (OpenAI's gpt-oss
# model card, "Checkpoint size"); Kimi-K2-Thinking about 594 GB (the Hub's file listing of moonshotai/Kimi-K2-Thinking).
GPT_OSS_120B_BYTES = 60.8 * (1 << 30)
KIMI_K2_THINKING_BYTES = 594e9


def plan(config: dict, hw=H100, **kw) -> dict:
    return plan_report(config, memory_bytes=hw.memory_bytes, devices_per_node=hw.devices_per_node, **kw)


def kimi_k2_thinking() -> dict:
    config = copy.deepcopy(CATALOG["kimi-k2"])
    config["quantization_config"] = copy.deepcopy(KIMI_K2_THINKING_QUANT)
    return config


def test_gpt_oss_120b_mxfp4_bytes_within_one_percent_of_the_checkpoint() -> None:
    report = plan(CATALOG["gpt-oss-120b"], dtype="auto", hardware_dtypes=H100.dtypes)
    assert report["dtype"] == "mxfp4"
    assert abs(report["weight_bytes"] / GPT_OSS_120B_BYTES - 1) < 0.01
    assert report["quant"]["bytes"] == report["weight_bytes"]
    assert report["quant"]["mode"] == "emulated" and report["quant"]["how"] == "dequantized at load to bfloat16"
    assert report["quant"]["runtime_bytes"] > 3.5 * report["weight_bytes"]  # the bf16 copy it really takes
    on_b200 = plan(CATALOG["gpt-oss-120b"], B200, dtype="auto", hardware_dtypes=B200.dtypes)["quant"]
    # B200 declares FP4, but the runtime has no native FP4 matmul: emulated, and the plan says why
    assert on_b200["mode"] == "emulated" and on_b200["reason"] == (
        "FP4 (mxfp4): no native FP4 matmul in the runtime; dequantized at load")
    assert report["quant"]["reason"] == "the hardware does not declare float4_e2m1fn; dequantized at load"


def test_kimi_k2_thinking_int4_bytes_within_one_percent_of_the_checkpoint() -> None:
    config = kimi_k2_thinking()
    assert resolve_dtype("auto", config) == ("int4-g32", "experts")
    report = plan(config, dtype="auto", hardware_dtypes=H100.dtypes)
    assert report["dtype"] == "int4-g32"
    assert abs(report["weight_bytes"] / KIMI_K2_THINKING_BYTES - 1) < 0.01
    # quantising every linear weight (the old rule) would miss by more than 1 %
    counts = count_params(parse_config(config))
    assert abs(weight_bytes(counts, "int4-g32") / KIMI_K2_THINKING_BYTES - 1) > 0.01


@pytest.mark.parametrize(("name", "bits_per_weight"), [
    ("mxfp4", 4 + 8 / 32), ("nvfp4", 4 + 8 / 16), ("int4", 4 + 16 / 128), ("int4-g32", 4 + 16 / 32),
    ("int4-g128-zp", 4 + 20 / 128), ("int8", 8), ("float8_e4m3fn-tensor", 8), ("float8_e4m3fn-channel", 8),
    ("float8_e4m3fn", 8 + 32 / 128 ** 2), ("q8_0", 34 * 8 / 32), ("q4_0", 18 * 8 / 32), ("q4_1", 20 * 8 / 32), ("q4_k", 144 * 8 / 256), ("q6_k", 210 * 8 / 256),
])
def test_bits_per_weight_of_each_format(name: str, bits_per_weight: float) -> None:
    values, rest, scales = format_bits(normalize_dtype(name))
    assert values + scales == pytest.approx(bits_per_weight) and rest == 16


@pytest.mark.parametrize(("quant", "expected"), [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}, "int4-g128-zp"),
    ({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True}, "int4-g64-zp"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
    ({"quant_method": "fbgemm_fp8"}, "float8_e4m3fn-channel"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "float8_e4m3fn"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "channel"}}}}, "float8_e4m3fn-channel"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}}}},
     "int4-g128-zp"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "int", "strategy": "channel"}}}}, "int8"),
])
def test_quantization_config_names_the_format(quant: dict, expected: str) -> None:
    assert resolve_dtype("auto", {**CATALOG["llama-3.1-8b"], "quantization_config": quant})[0] == expected


def test_native_or_emulated_follows_the_declared_dtypes() -> None:
    a100 = get_hardware("nvidia-a100-sxm-80gb")
    fp8 = plan(CATALOG["llama-3.1-8b"], a100, dtype="fp8", hardware_dtypes=a100.dtypes)
    assert fp8["quant"]["mode"] == "emulated" and fp8["quant"]["runtime_bytes"] == plan(
        CATALOG["llama-3.1-8b"], a100, dtype="bf16")["weight_bytes"]
    mi300 = get_hardware("amd-mi300x")
    block = plan(CATALOG["llama-3.1-8b"], mi300, dtype="fp8", hardware_dtypes=mi300.dtypes)["quant"]
    assert block["mode"] == "emulated" and block["reason"].startswith("block FP8: no native block FP8 matmul")
    for hw in (mi300, H100):  # FP8 per tensor / per channel: the runtime's native W8A8 path
        for fmt in ("float8_e4m3fn-tensor", "float8_e4m3fn-channel"):
            quant = plan(CATALOG["llama-3.1-8b"], hw, dtype=fmt, hardware_dtypes=hw.dtypes)["quant"]
            assert quant["mode"] == "native" and "reason" not in quant and quant["runtime_bytes"] == quant["bytes"]
    assert plan(CATALOG["llama-3.1-8b"], a100, dtype="float8_e4m3fn-channel",
                hardware_dtypes=a100.dtypes)["quant"]["mode"] == "emulated"
    assert "quant" not in plan(CATALOG["llama-3.1-8b"], dtype="bf16", hardware_dtypes=H100.dtypes)
    assert plan(CATALOG["llama-3.1-8b"], dtype="q4_k")["quant"]["mode"] == "unknown"  # no hardware given
