"""GGUF K-quants: the Q4_K/Q6_K quantisers written here round-trip through the gguf package's own
``gguf.quants.dequantize`` (which cannot quantise them), and a K-quant release (the real SmolLM2 GGUF with its
feed-forward down projections re-quantised to Q4_K and Q6_K, as llama.cpp's Q4_K_M mixes them) loads directly,
strictly, with greedy tokens equal to transformers' own GGUF loader."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from agents.runtime.loader import load_model
from agents.runtime.models.simple_decode import greedy_decode
from agents.runtime.testing.gguf_kquants import QUANTIZERS, requantize_gguf
from agents.runtime.testing.real_models import real_gguf_release

PROMPTS = ["The capital of France is", "def add(a, b):\n    return"]


@pytest.mark.parametrize(("kind", "nbytes", "bound"), [("Q4_K", 144, 0.12), ("Q6_K", 210, 0.03)])
def test_quantiser_round_trips_through_gguf_dequantize(kind, nbytes, bound) -> None:
    qtype = gguf.GGMLQuantizationType[kind]
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6, 512)) * 0.05).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block
    x[1, :32] += 0.2  # a sub-block far from zero (Q4_K's min)
    with pytest.raises(NotImplementedError):
        gguf.quants.quantize(x, qtype)  # why it is written here
    packed = QUANTIZERS[kind](x)
    assert packed.dtype == np.uint8 and packed.shape == (6, 2 * nbytes)
    y = gguf.quants.dequantize(packed, qtype)
    assert y.shape == x.shape and np.all(y[0, :256] == 0)
    rel = np.sqrt(((y - x) ** 2).mean()) / np.sqrt((x ** 2).mean())
    assert 0 < rel < bound  # a misplaced bit or nibble would be of the order of 1
    with pytest.raises(ValueError, match="multiple of 256"):
        QUANTIZERS[kind](x[:, :200])


@pytest.fixture(scope="module")
def kquant_release(tmp_path_factory):
    src = next(real_gguf_release("smollm2-135m").glob("*.gguf"))
    out = tmp_path_factory.mktemp("kquant")

    def types(name: str, shape: tuple[int, ...]) -> str | None:
        if name.endswith("ffn_down.weight"):  # rows of 1536: the only tensors a multiple of 256 wide in SmolLM2
            return "Q6_K" if int(name.split(".")[1]) % 2 else "Q4_K"
        return None

    requantize_gguf(src, out / src.name, types)
    return out


@pytest.mark.slow  # ~4 min on the shared 2 cores: transformers dequantises the whole GGUF on its side too
def test_kquant_release_loads_with_tokens_equal_to_transformers_gguf_loader(kquant_release) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    loaded = load_model(kquant_release)
    quant = loaded.report["quant"]
    assert loaded.report["ok"] and quant["mode"] == "emulated"
    assert quant["types"] == {"F32": 61, "Q4_1": 180, "Q4_K": 15, "Q6_K": 15, "Q8_0": 1}
    name = next(kquant_release.glob("*.gguf")).name
    ref = AutoModelForCausalLM.from_pretrained(kquant_release, gguf_file=name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(kquant_release, gguf_file=name)
    seqs = [tok(p)["input_ids"] for p in PROMPTS]
    ours = greedy_decode(loaded.model, seqs, 12, block_size=16)
    with torch.no_grad():
        for s, tokens in zip(seqs, ours, strict=True):
            out = ref.generate(torch.tensor([s]), max_new_tokens=12, do_sample=False, eos_token_id=None)
            assert tokens == out[0, len(s):].tolist()
