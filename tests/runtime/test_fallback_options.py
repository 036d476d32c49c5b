"""Native first, generic fallback, also for options: a known architecture whose config sets an option its
native family does not implement runs on the transformers fallback (equal to transformers), and the report's
model section says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.models.registry import native_gaps, runtime_path
from agents.runtime.testing.make_model import cached_model

OPTIONS = {
    "rope-dynamic": ({"rope_parameters": {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0}},
                     "'dynamic'"),
    "gelu": ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    "mlp-bias": ({"mlp_bias": True}, "mlp_bias"),
}


def _variant(tmp_path: Path, change: dict) -> Path:
    """The tiny Llama with ``change`` applied to its config (and, for mlp_bias, zero biases saved with it)."""
    src = cached_model("llama")
    out = tmp_path / "model"
    shutil.copytree(src, out)
    config = {**json.loads((src / "config.json").read_text()), **change}
    (out / "config.json").write_text(json.dumps(config))
    if change.get("mlp_bias"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)  # biases start at zero
        for f in out.glob("*.safetensors*"):
            f.unlink()
        model.save_pretrained(out)
    return out


def test_the_unmodified_llama_stays_native():
    config = json.loads((cached_model("llama") / "config.json").read_text())
    assert native_gaps(config) == [] and runtime_path(config) == ("native", None)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_an_option_the_native_family_lacks_runs_on_the_fallback(tmp_path, option):
    from transformers import AutoModelForCausalLM

    change, reason_part = OPTIONS[option]
    model_dir = _variant(tmp_path, change)
    engine = LLMEngine(model_dir, num_blocks=32)
    assert engine.model.path == "fallback" and reason_part in engine.model.fallback_reason
    assert engine.load_report["ok"]
    prompt = [5, 17, 42, 7, 99]
    out = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(ref(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out.output_token_ids == ids[len(prompt):]


def test_the_report_model_section_names_the_reason(tmp_path):
    from agents.pipeline.runner import model_info
    from agents.pipeline.support.context import StageContext

    model_dir = _variant(tmp_path, OPTIONS["gelu"][0])
    config = json.loads((model_dir / "config.json").read_text())
    info = model_info(StageContext(model_dir=model_dir, config=config, hardware={"slug": "cpu"}))
    assert info["path"] == "fallback" and "hidden_act 'gelu'" in info["fallback_reason"]
    native = json.loads((cached_model("llama") / "config.json").read_text())
    assert "fallback_reason" not in model_info(StageContext(model_dir=None, config=native, hardware={}))


def test_rope_scaling_missing_its_factor_is_a_gap_not_a_crash():
    config = json.loads((cached_model("llama") / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "linear"}
    assert any("linear" in g for g in native_gaps(config))


def test_a_malformed_rope_scaling_is_a_clear_load_error(tmp_path):
    from agents.runtime.loader import LoadError, load_model

    model_dir = _variant(tmp_path, {"rope_scaling": [1, 2]})
    with pytest.raises(LoadError, match="rope_scaling must be an object"):
        load_model(model_dir)


def test_a_llava_whose_decoder_has_a_gap_takes_images_on_the_fallback(tmp_path):
    """A LLaVA whose decoder sets an option the native Llama lacks runs whole on the fallback, images included:
    the tower once per request, its features handed back at each recompute step; greedy equals transformers."""
    import numpy as np
    import transformers
    from PIL import Image

    from agents.runtime.engine.multimodal import ImageInputs

    src = cached_model("llava")
    model_dir = tmp_path / "model"
    shutil.copytree(src, model_dir)
    config = json.loads((src / "config.json").read_text())
    config["text_config"]["hidden_act"] = "gelu"
    (model_dir / "config.json").write_text(json.dumps(config))
    ref = transformers.LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = transformers.AutoProcessor.from_pretrained(model_dir)
    image = Image.fromarray(np.random.RandomState(0).randint(0, 256, (40, 52, 3), dtype=np.uint8))
    prompt = "<s><|im_start|>user\n<image>what is in the picture?<|im_end|>\n<|im_start|>assistant\n"
    enc = processor(images=[image], text=prompt, return_tensors="pt", add_special_tokens=False)
    ids = enc["input_ids"][0].tolist()
    want = ref.generate(**enc, max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    engine = LLMEngine(model_dir, num_blocks=32)
    assert engine.model.path == "fallback" and "hidden_act 'gelu'" in engine.model.fallback_reason
    assert engine.model.takes_images and engine.model.image_token_id == config["image_token_index"]
    rid = engine.add_request(ids, SamplingParams(max_tokens=8, temperature=0.0),
                             images=ImageInputs.from_processor(enc, ids, engine.model.image_token_id))
    got: list[int] = []
    while engine.has_unfinished():
        got = next((o.output_token_ids for o in engine.step() if o.request_id == rid and o.finished), got)
    assert got == want
    assert engine.model.num_image_encodes == 1
