"""The engine warms up on ordinary text of the model's own tokenizer: a vision-language model whose image token
has a small id (1, 2 or 3, ids that were once the fixed warm-up prompt) starts and serves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.testing.make_model import cached_model


def _llava_with_image_token(tmp_path: Path, token: int) -> Path:
    out = tmp_path / f"llava-image-{token}"
    shutil.copytree(cached_model("llava"), out)
    config = json.loads((out / "config.json").read_text())
    config["image_token_id"] = token
    config["image_token_index"] = token
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("image_token", [1, 2, 3])
def test_a_vlm_whose_image_token_is_a_small_id_warms_up(tmp_path: Path, image_token: int) -> None:
    engine = LLMEngine(_llava_with_image_token(tmp_path, image_token), dtype="float32", device="cpu",
                       max_num_seqs=2, num_blocks=64)
    assert engine.model.image_token_id == image_token
    prompt = engine.warmup_prompt()
    assert prompt and image_token not in prompt
    assert not set(prompt) & engine.reserved_token_ids()
    engine.warmup()  # refused its own prompt before: "the prompt holds the image placeholder token 3 but no image"
    out = engine.generate(["hello there"], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))[0]
    assert out.error is None and len(out.output_token_ids) == 3


def test_the_warmup_prompt_is_the_tokenizers_own_text() -> None:
    engine = LLMEngine(cached_model("llama"), dtype="float32", device="cpu", max_num_seqs=2, num_blocks=64)
    prompt = engine.warmup_prompt()
    text = engine.tokenizer.decode(prompt)
    assert len(prompt) == 4 and text.strip() and text.split()[0] in {"The", "the"}
    reserved = engine.reserved_token_ids()
    assert engine.tokenizer.eos_token_ids <= reserved
    assert not set(prompt) & reserved
