"""The plan counts a vision-language model's vision tower and projector exactly (against transformers' own
modules) and its weight bytes include them."""

from __future__ import annotations

import json

import pytest

from agents.runtime.testing.make_model import cached_model
from contract.model.params import count_params
from contract.model.spec import parse_config
from contract.model.vision_params import count_vision_params, count_vision_tower
from contract.planner import plan_report

transformers = pytest.importorskip("transformers")


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_the_tiny_llava_counts_every_checkpoint_parameter():
    path = cached_model("llava")
    config = json.loads((path / "config.json").read_text())
    model = transformers.LlavaForConditionalGeneration.from_pretrained(path)
    counts = count_params(parse_config(config))
    assert counts.total == _numel(model)
    assert counts.vision == _numel(model.model.vision_tower) + _numel(model.model.multi_modal_projector) > 0
    text_only = plan_report(config["text_config"] | {"architectures": ["LlamaForCausalLM"]},
                            memory_bytes=2**30, devices_per_node=1, dtype="float32")
    report = plan_report(config, memory_bytes=2**30, devices_per_node=1, dtype="float32")
    assert report["params_total"] == counts.total
    assert report["weight_bytes"] - text_only["weight_bytes"] == 4 * counts.vision


@pytest.mark.parametrize("use_head", [True, False])
def test_siglip_towers_are_counted_as_transformers_builds_them(use_head):
    vision = {"model_type": "siglip_vision_model", "hidden_size": 24, "intermediate_size": 40,
              "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 28, "patch_size": 7,
              "num_channels": 3, "vision_use_head": use_head}
    hf = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision))
    assert count_vision_tower(vision) == _numel(hf)


def test_clip_tower_and_a_text_model():
    vision = {"model_type": "clip_vision_model", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 3,
              "num_attention_heads": 2, "image_size": 20, "patch_size": 5}
    assert count_vision_tower(vision) == _numel(transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**vision)))
    assert count_vision_params({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}) == 0
    with pytest.raises(ValueError, match="counted for clip_vision_model and siglip_vision_model"):
        count_vision_tower({**vision, "model_type": "pixtral"})


@pytest.mark.parametrize("arch", ["qwen2.5-vl", "qwen2-vl", "qwen3-vl"])
def test_the_tiny_qwen_vl_counts_every_checkpoint_parameter(arch):
    path = cached_model(arch)
    config = json.loads((path / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(path)
    counts = count_params(parse_config(config))
    assert counts.total == _numel(model)  # the decoder's q/k/v biases included (no config key says so)
    assert counts.vision == _numel(model.model.visual) > 0  # the patch merger is part of the tower
    report = plan_report(config, memory_bytes=2**30, devices_per_node=1, dtype="float32")
    assert report["params_total"] == counts.total


def test_qwen2_vl_towers_are_counted_as_transformers_builds_them():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    vision = {"model_type": "qwen2_vl", "depth": 2, "embed_dim": 24, "hidden_size": 40, "mlp_ratio": 2,
              "num_heads": 2, "in_channels": 3, "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2}
    hf = Qwen2VisionTransformerPretrainedModel(transformers.Qwen2VLVisionConfig(**vision))
    assert count_vision_params({"model_type": "qwen2_vl", "vision_config": vision}) == _numel(hf)


def test_the_bundled_qwen2_5_vl_7b_config_is_counted_as_transformers_builds_it():
    """The public Qwen2.5-VL-7B config (flat decoder keys, "mrope" RoPE, a tower without its model_type):
    8,292,166,656 parameters, its published 8.29B, as transformers builds it on the meta device."""
    import torch

    from contract.hardware import find_config

    config = find_config("qwen2.5-vl-7b")
    counts = count_params(parse_config(config))
    with torch.device("meta"):
        hf = transformers.Qwen2_5_VLForConditionalGeneration(transformers.AutoConfig.for_model(**config))
    assert counts.total == _numel(hf) == 8_292_166_656
    assert counts.vision == _numel(hf.model.visual)
    report = plan_report(config, memory_bytes=80 * 2**30, devices_per_node=8, dtype="bfloat16")
    assert report["fits"] and report["plan"]["tp"] == 1
