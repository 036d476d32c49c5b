"""Integer weight formats loaded strictly and emulated (dequantised at load): compressed-tensors pack-quantized
INT4/INT8 (written by the compressed-tensors library), GPTQ 4-bit (with act-order) and AWQ 4-bit (packed here from
their published layouts). Each load equals the dequantised reference exactly and decodes the same greedy tokens;
the symmetric compressed-tensors ones also equal transformers' own compressed-tensors loader. Planted layout errors
(a group size off by one, transposed scales, a wrong g_idx) are refused naming the tensor and the format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agents.runtime.layers.int_quant import pack_words, unpack_words
from agents.runtime.loader import LoadError, load_model
from agents.runtime.models.simple_decode import greedy_decode
from agents.runtime.testing import int_models
from agents.runtime.testing.make_model import cached_model

PROMPTS = [[1, 5, 9, 33, 100, 7], [1, 200, 17]]
FORMATS = {
    "ct-int4-g32": lambda src, out: int_models.write_compressed_tensors(src, out),
    "ct-int4-g32-asym": lambda src, out: int_models.write_compressed_tensors(src, out, symmetric=False),
    "ct-int8-channel": lambda src, out: int_models.write_compressed_tensors(src, out, bits=8, group=None),
    "ct-int8-channel-asym": lambda src, out: int_models.write_compressed_tensors(src, out, bits=8, group=None,
                                                                                 symmetric=False),
    "gptq-g32": lambda src, out: int_models.write_gptq(src, out),
    "gptq-g32-actorder-asym": lambda src, out: int_models.write_gptq(src, out, act_order=True, symmetric=False),
    "awq-g32": lambda src, out: int_models.write_awq(src, out),
}


@pytest.fixture(scope="module")
def src() -> Path:
    return cached_model("llama", "tiny")


@pytest.fixture(scope="module")
def releases(src, tmp_path_factory) -> dict[str, tuple[Path, Path, dict]]:
    root = tmp_path_factory.mktemp("int")
    out = {}
    for label, write in FORMATS.items():
        release, reference = write(src, root / label)
        out[label] = (release, int_models.write_reference(src, root / f"{label}-ref", reference), reference)
    return out


@pytest.mark.parametrize("label", list(FORMATS))
def test_loads_strictly_equal_to_the_dequantised_reference(label, releases, src) -> None:
    release, ref_dir, reference = releases[label]
    loaded, ref = load_model(release), load_model(ref_dir)
    quant = loaded.report["quant"]
    assert loaded.report["ok"] and quant["mode"] == "emulated" and quant["how"] == "dequantized at load"
    assert quant["converted"] == len(reference) == 14  # 7 linears × 2 layers; embeddings, norms, head unquantised
    assert quant["runtime_bytes"] == sum(p.numel() * 4 for p in loaded.model.parameters())
    assert quant["bytes"] < quant["runtime_bytes"]
    ours, theirs = dict(loaded.model.named_parameters()), dict(ref.model.named_parameters())
    for name, param in ours.items():
        assert torch.equal(param, theirs[name]), name
    original = int_models.read_release(src)[1]["model.layers.0.mlp.down_proj.weight"]
    assert not torch.equal(reference["model.layers.0.mlp.down_proj.weight"], original)  # it was quantised
    assert greedy_decode(loaded.model, PROMPTS, 8) == greedy_decode(ref.model, PROMPTS, 8)


@pytest.mark.parametrize("label", ["ct-int4-g32", "ct-int8-channel"])
def test_greedy_tokens_equal_transformers_compressed_tensors_loader(label, releases) -> None:
    # transformers 5.25 with compressed-tensors 0.20 decompresses symmetric pack-quantized checkpoints on CPU; it
    # refuses the asymmetric ones (it expects an unpacked zero point), so those compare with the reference above.
    from transformers import AutoModelForCausalLM

    release = releases[label][0]
    ref = AutoModelForCausalLM.from_pretrained(release, dtype=torch.float32).eval()
    ours = greedy_decode(load_model(release).model, PROMPTS, 8)
    with torch.no_grad():
        for prompt, tokens in zip(PROMPTS, ours, strict=True):
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None)
            assert tokens == out[0, len(prompt):].tolist()


def test_packing_matches_compressed_tensors_own_packer() -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    gen = torch.Generator().manual_seed(0)
    for bits in (4, 8):
        codes = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (6, 40), generator=gen, dtype=torch.int8)
        theirs = pack_to_int32(codes, bits)
        assert torch.equal(pack_words(codes.long() + (1 << (bits - 1)), bits), theirs)
        assert torch.equal(unpack_words(theirs, bits, 40) - (1 << (bits - 1)), codes.int())


def _edit(release: Path, out: Path, change) -> Path:  # noqa: ANN001
    out.mkdir()
    for f in release.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(release / "model.safetensors")
    change(tensors)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


NAME = "model.layers.1.mlp.down_proj"


def test_group_size_off_by_one_is_refused(releases, src, tmp_path) -> None:
    # the config says groups of 31 where the scales were written for 32: [64, 4] where 31 needs [64, 5]
    bad, _ = int_models.write_compressed_tensors(src, tmp_path / "g31", group=32)
    config = json.loads((bad / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 31
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match=r"compressed-tensors pack-quantized INT4 \(group 31, symmetric\): tensor "
                                        r"'model\.layers\.0\.mlp\.down_proj\.weight_scale' has shape \[64, 4\], "
                                        r"expected \[64, 5\] for weight \[64, 128\]"):
        load_model(bad)


def test_transposed_scales_are_refused(releases, tmp_path) -> None:
    def transpose(t: dict) -> None:  # noqa: ANN001
        t[f"{NAME}.weight_scale"] = t[f"{NAME}.weight_scale"].t().contiguous()

    with pytest.raises(LoadError, match=rf"tensor '{NAME}\.weight_scale' has shape \[4, 64\], expected \[64, 4\]"):
        load_model(_edit(releases["ct-int4-g32"][0], tmp_path / "ct", transpose))

    def transpose_awq(t: dict) -> None:  # noqa: ANN001
        t[f"{NAME}.scales"] = t[f"{NAME}.scales"].t().contiguous()

    with pytest.raises(LoadError, match=rf"AWQ INT4 \(group 32, asymmetric\): tensor '{NAME}\.scales' has shape "
                                        rf"\[64, 4\], expected \[4, 64\]"):
        load_model(_edit(releases["awq-g32"][0], tmp_path / "awq", transpose_awq))


def test_gptq_g_idx_off_by_one_and_dtype_are_refused(releases, tmp_path) -> None:
    def shift(t: dict) -> None:  # noqa: ANN001
        t[f"{NAME}.g_idx"] = (torch.arange(128) // 31).clamp(max=3).to(torch.int32)  # groups of 31, not 32

    with pytest.raises(LoadError, match=rf"GPTQ INT4 .*tensor '{NAME}\.g_idx' puts 31 input rows in group 0"):
        load_model(_edit(releases["gptq-g32"][0], tmp_path / "gidx", shift))

    def to_fp16(t: dict) -> None:  # noqa: ANN001
        t[f"{NAME}.qzeros"] = t[f"{NAME}.qzeros"].half()

    with pytest.raises(LoadError, match=rf"tensor '{NAME}\.qzeros' has dtype F16, expected I32"):
        load_model(_edit(releases["gptq-g32"][0], tmp_path / "dtype", to_fp16))


def test_a_missing_or_stray_tensor_and_a_wrong_weight_shape_are_refused(releases, tmp_path) -> None:
    release = releases["ct-int4-g32-asym"][0]
    with pytest.raises(LoadError, match=rf"missing tensor '{NAME}\.weight_zero_point'"):
        load_model(_edit(release, tmp_path / "a", lambda t: t.pop(f"{NAME}.weight_zero_point")))

    def stray(t: dict) -> None:  # noqa: ANN001
        t[f"{NAME}.weight"] = torch.zeros(64, 128)

    with pytest.raises(LoadError, match=rf"tensor '{NAME}\.weight' is stored unquantised"):
        load_model(_edit(release, tmp_path / "b", stray))

    def shape(t: dict) -> None:  # noqa: ANN001
        t[f"{NAME}.weight_shape"] = torch.tensor([128, 64])

    with pytest.raises(LoadError, match=rf"tensor '{NAME}\.weight_shape' says \[128, 64\]"):
        load_model(_edit(release, tmp_path / "c", shape))


def test_an_unsupported_integer_layout_is_refused_naming_the_key(releases, tmp_path) -> None:
    release = releases["awq-g32"][0]
    out = _edit(release, tmp_path / "gemv", lambda t: None)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["version"] = "gemv"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match=r"config.json: quantization_config: AWQ version 'gemv'"):
        load_model(out)


@pytest.mark.parametrize(("fmt", "method"), [("gptq-actorder", "gptq"), ("int8-ct", "compressed-tensors")])
def test_make_model_quant_builds_a_release_beside_its_original(fmt, method, tmp_path) -> None:
    from day0cli.main import main

    out = tmp_path / "m"
    assert main(["make-model", "--arch", "llama", "--quant", fmt, "--out", str(out)]) == 0
    loaded, original = load_model(out), load_model(out / "original")
    assert loaded.report["quant"]["format"] == method and original.report.get("quant") is None
    assert main(["make-model", "--arch", "mixtral", "--quant", fmt, "--out", str(tmp_path / "moe")]) == 2
