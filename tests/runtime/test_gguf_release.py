"""The real SmolLM2 GGUF (Q4_1 blocks, a Q8_0 embedding) loaded directly as a quantised release: strictly,
dequantised at load with the gguf package, greedy tokens equal to transformers' own GGUF loader in fp32 (the
dequantised reference), and tensors the runtime cannot take refused naming the tensor and the format."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from agents.runtime.loader import LoadError, load_model
from agents.runtime.loader.gguf_release import hf_name, unpermute
from agents.runtime.models.simple_decode import greedy_decode
from agents.runtime.testing.real_models import REAL_MODELS, real_gguf_release

PROMPTS = ["The capital of France is", "def add(a, b):\n    return"]


@pytest.fixture(scope="module")
def release():
    return real_gguf_release("smollm2-135m")


@pytest.fixture(scope="module")
def loaded(release):
    torch.set_num_threads(2)
    return load_model(release)


def test_the_release_is_only_the_pinned_gguf(release) -> None:
    assert [p.name for p in release.iterdir()] == [REAL_MODELS["smollm2-135m"].member.split("/")[-1]]


@pytest.mark.slow
def test_loaded_emulated_with_the_bytes_it_takes(loaded, release) -> None:
    report = loaded.report
    assert report["ok"] and report["path"] == "native" and report["architecture"] == "LlamaForCausalLM"
    quant = report["quant"]
    assert quant["mode"] == "emulated" and quant["how"] == "dequantized at load"
    assert quant["types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    params = sum(p.numel() for p in loaded.model.parameters())
    assert quant["runtime_bytes"] == 4 * params  # fp32: what dequantising at load takes
    # Q4_1 stores 20 bytes per 32 weights, Q8_0 34: the packed weights are a fraction of the fp32 copy
    assert quant["bytes"] <= report["bytes"] and quant["runtime_bytes"] > 5 * quant["bytes"]


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_gguf_loader_in_fp32(loaded, release) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = next(release.glob("*.gguf")).name
    ref = AutoModelForCausalLM.from_pretrained(release, gguf_file=gguf, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(release, gguf_file=gguf)
    seqs = [tok(p)["input_ids"] for p in PROMPTS]
    ours = greedy_decode(loaded.model, seqs, 12, block_size=16)
    with torch.no_grad():
        for s, tokens in zip(seqs, ours, strict=True):
            out = ref.generate(torch.tensor([s]), max_new_tokens=12, do_sample=False, eos_token_id=None)
            assert tokens == out[0, len(s):].tolist()
    assert "Paris" in tok.decode(ours[0])


def test_unpermute_inverts_llama_cpp_rope_permutation() -> None:
    w = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    heads = 2
    permuted = w.reshape(heads, 2, 2, 3).swapaxes(1, 2).reshape(8, 3)  # llama.cpp's converter
    assert torch.equal(unpermute(permuted, heads), w)
    assert hf_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
    assert hf_name("blk.3.ssm_a") is None


@pytest.mark.slow
def test_a_quant_type_the_runtime_cannot_take_is_refused_naming_tensor_and_format(release, tmp_path) -> None:
    import gguf

    reader = gguf.GGUFReader(next(release.glob("*.gguf")))
    writer = gguf.GGUFWriter(tmp_path / "bad.gguf", "llama")
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "general.architecture")):
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(field.name, value)
        else:
            writer.add_key_value(field.name, value, kind)
    for t in reader.tensors:
        if t.name == "blk.0.attn_q.weight":  # stored as Q5_0: a GGUF type this runtime does not dequantise
            values = gguf.quants.dequantize(t.data, t.tensor_type)
            data = gguf.quants.quantize(values.astype(np.float32), gguf.GGMLQuantizationType.Q5_0)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType.Q5_0)
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape,
                              raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(LoadError, match=r"tensor 'blk\.0\.attn_q\.weight' is stored as GGUF Q5_0"):
        load_model(tmp_path)
    shutil.rmtree(tmp_path)
