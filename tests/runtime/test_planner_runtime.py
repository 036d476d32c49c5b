"""The planner proposes only layouts the runtime can run: a native family any TP × PP × EP within the rules, an
architecture only the transformers fallback runs (Qwen-VL, gpt-oss, unknown ones) one device, and a plan that
does not fit that device says so. The config-only decision (``models/native.py``, no torch) equals the
runtime's own (``registry.runtime_path``); a native LLaVA's vision tower counts whole on each first-stage device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agents.runtime.testing.make_model import cached_model
from contract.hardware import find_config, get_hardware, load_model_catalog
from contract.model.native import config_runtime_path, single_device_reason
from contract.model.params import count_params
from contract.model.spec import parse_config
from contract.planner import plan_report
from contract.planner.search import LayoutError, check_layout, config_layout_error

H100, H200 = get_hardware("nvidia-h100-sxm"), get_hardware("nvidia-h200")
QWEN_VL = find_config("qwen2.5-vl-7b")
# llava-hf/llava-1.5-7b-hf: a CLIP ViT-L/14 tower at 336 px, the two-layer projector, a Llama-2-7B decoder
LLAVA_7B = {
    "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": 32000,
    "projector_hidden_act": "gelu", "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
    "torch_dtype": "float16",
    "text_config": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
                    "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                    "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 4096,
                    "rms_norm_eps": 1e-5},
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                      "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                      "projection_dim": 768, "hidden_act": "quick_gelu"},
}


def _plan(config: dict, hw=H100, **kw) -> dict:
    return plan_report(config, memory_bytes=hw.memory_bytes, devices_per_node=hw.devices_per_node, **kw)


def _variants() -> dict[str, dict]:
    """Configs the two decisions must agree on: the bundled public ones, the tiny test families, and options a
    native family lacks (each alone, so both name the same reason)."""
    out = {row["slug"]: row["config"] for row in load_model_catalog()}
    for arch in ("llama", "mixtral", "deepseek-v3", "llava", "llava-siglip", "qwen2-vl", "qwen2.5-vl", "qwen3-vl"):
        out[arch] = json.loads((cached_model(arch) / "config.json").read_text())
    llama, deepseek, llava = out["llama"], out["deepseek-v3"], out["llava"]
    rope = {"rope_theta": 10000.0}
    for name, change in {
        "rope-dynamic": {"rope_parameters": {**rope, "rope_type": "dynamic", "factor": 2.0}},
        "rope-linear-no-factor": {"rope_parameters": {**rope, "rope_type": "linear"}},
        "rope-linear": {"rope_parameters": {**rope, "rope_type": "linear", "factor": 2.0}},
        "rope-yarn": {"rope_scaling": {"type": "yarn", "factor": 4.0}},
        "rope-llama3": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
        "rope-llama3-no-high": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "original_max_position_embeddings": 8192}},
        "gelu": {"hidden_act": "gelu"}, "swish": {"hidden_act": "swish"}, "mlp-bias": {"mlp_bias": True},
        "unknown-arch": {"architectures": ["FrobForCausalLM"]},
    }.items():
        out[name] = {**llama, **change}
    out["deepseek-scoring"] = {**deepseek, "scoring_func": "tanh"}
    out["llava-gelu-decoder"] = {**llava, "text_config": {**llava["text_config"], "hidden_act": "gelu"}}
    out["llava-qwen2-decoder"] = {**llava, "text_config": {**llava["text_config"], "model_type": "qwen2"}}
    out["llava-mistral-decoder"] = {**llava, "text_config": {**llava["text_config"], "model_type": "mistral"}}
    return out


def test_the_config_only_decision_equals_the_runtimes() -> None:
    from agents.runtime.models.registry import runtime_path

    paths = set()
    for name, config in _variants().items():
        assert config_runtime_path(config) == runtime_path(config), name
        paths.add(runtime_path(config)[0])
    assert paths == {"native", "fallback"}
    assert runtime_path(_variants()["llava-qwen2-decoder"]) == (
        "fallback", "the native LlavaForConditionalGeneration does not implement: text_config.model_type 'qwen2' "
                    "(the native decoder is llama or mistral)")


def test_the_planner_and_the_decision_import_no_torch() -> None:
    code = ("import sys, json; from contract.planner import plan_report; "
            "from contract.planner.search import config_layout_error; "
            f"r = plan_report(json.loads({json.dumps(QWEN_VL)!r}), memory_bytes=80 << 30, "
            "devices_per_node=8); "
            "print(r['runtime']['path'], sorted(m for m in ('django', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "fallback []"


def test_a_fallback_model_is_planned_on_one_device_only() -> None:
    report = _plan(QWEN_VL)  # 15.5 GiB of bf16 weights on an 80 GB device
    assert report["runtime"]["path"] == "fallback" and "no native implementation" in report["runtime"]["reason"]
    assert report["fits"] and report["plan"] == {"tp": 1, "pp": 1, "ep": 1, "devices": 1, "nodes": 1}
    assert [(c["tp"], c["pp"], c["ep"]) for c in report["candidates"]] == [(1, 1, 1)]


def test_a_fallback_model_that_does_not_fit_one_device_says_so_and_proposes_no_layout() -> None:
    report = plan_report(QWEN_VL, memory_bytes=16 * 10**9, devices_per_node=8)  # tp=2 would fit: 9.5 GiB each
    assert not report["fits"] and report["plan"]["devices"] == 1 and len(report["candidates"]) == 1
    assert report["message"].startswith("does not fit one device: architecture 'Qwen2_5_VLForConditionalGeneration'"
                                        " has no native implementation: the transformers fallback runs on one "
                                        "device only (tp, pp and ep 1), and at bfloat16 one device needs ")
    assert "short by 4.35 GiB" in report["message"]
    native = plan_report({**LLAVA_7B, "torch_dtype": "bfloat16"}, memory_bytes=16 * 10**9, devices_per_node=8)
    assert native["runtime"]["path"] == "native" and native["fits"] and native["plan"]["tp"] == 2  # a native VLM


def test_pinned_degrees_above_one_are_refused_for_a_fallback_model_naming_why() -> None:
    for pins, field in (({"tp": 2}, "tp"), ({"pp": 2}, "pp"), ({"tp": 1, "pp": 4}, "pp")):
        report = _plan(QWEN_VL, **pins)
        assert report["plan"] is None and not report["fits"] and report["candidates"] == []
        assert f"{field}={pins[field]} cannot run: architecture 'Qwen2_5_VLForConditionalGeneration'" in \
            report["message"]
        error = config_layout_error(QWEN_VL, H100, pins.get("tp"), pins.get("pp"), pins.get("ep"))
        assert isinstance(error, LayoutError) and error.field == field
        assert str(error).endswith("the transformers fallback runs on one device only (tp, pp and ep 1)")
    assert config_layout_error(QWEN_VL, H100, 1, 1, 1) is None and _plan(QWEN_VL, tp=1)["fits"]
    gpt_oss = find_config("gpt-oss-120b")  # an MoE on the fallback: no EP either
    with pytest.raises(LayoutError, match="ep=4 cannot run: architecture 'GptOssForCausalLM'"):
        check_layout(parse_config(gpt_oss), H100, ep=4, single_device=single_device_reason(gpt_oss))


def test_a_native_llava_is_planned_over_tp_and_pp_with_its_tower_whole_on_each_first_stage_device() -> None:
    text = {**LLAVA_7B["text_config"], "torch_dtype": "float16"}
    vision_bytes = 2 * count_params(parse_config(LLAVA_7B)).vision  # fp16
    assert 300e6 < vision_bytes / 2 < 330e6  # CLIP ViT-L/14 (303 M) and the projector (21 M)
    for pins in ({"tp": 2}, {"tp": 4}, {"tp": 8, "pp": 2}):
        llava, alone = _plan(LLAVA_7B, H200, **pins), _plan(text, H200, **pins)
        assert llava["runtime"]["path"] == "native" and llava["fits"]
        assert llava["plan"] == alone["plan"] and llava["vision_bytes_per_device"] == vision_bytes
        extra = llava["breakdown"]["weights"] - alone["breakdown"]["weights"]
        if pins.get("pp", 1) == 1:
            assert extra == vision_bytes  # not split over tp: every TP rank of the stage holds the whole tower
        else:  # the first stage holds the tower; the text-only model's heaviest stage is the last (its final
            assert extra == vision_bytes - 2 * text["hidden_size"] // pins["tp"]  # norm, counted with the head)
    assert _plan(LLAVA_7B, H200, dtype="bfloat16")["plan"]["devices"] == 1  # 14 GB fits one 141 GB device
