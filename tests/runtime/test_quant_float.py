"""Float quantised releases (MXFP4, NVFP4, FP8 per tensor / per channel; ``layers/quant_float.py``): each made by
``make-model --quant``'s quantiser from a random-weight original, loaded strictly (every part's shape and dtype),
reported (format, mode, bytes), and its greedy tokens equal transformers' own loader of the format where it has
one that runs here (compressed-tensors FP8), else transformers on the independently dequantised weights."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agents.runtime.commands import make_model as make_model_command
from agents.runtime.layers.quant_float import E2M1, Mxfp4, Nvfp4, unpack_e2m1
from agents.runtime.loader import LoadError, load_model
from agents.runtime.loader.quant_reference import dequantized_reference
from agents.runtime.models.simple_decode import greedy_decode
from agents.runtime.testing import quant_release
from agents.runtime.testing.make_model import cached_model
from agents.runtime.testing.quant_release import QUANT_CHOICES, quantize_mxfp4, quantize_nvfp4, quantize_release
from contract.planner.formats import checkpoint_format

PROMPTS = [[1, 17, 93, 250, 4, 77], [1, 300, 12]]
FORMAT_NAME = {"mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp8-tensor": "float8_e4m3fn-tensor",
               "fp8-channel": "float8_e4m3fn-channel"}


@pytest.fixture(autouse=True)
def checksum_cache(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("DAY0_CHECKSUM_CACHE", str(tmp_path / "sha256-cache.json"))


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:  # noqa: ANN001
    root = tmp_path_factory.mktemp("quant-float")
    src = cached_model("llama")
    return {fmt: quantize_release(src, fmt, root / fmt) for fmt in QUANT_CHOICES}


def edited(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    """A copy of a release with its tensors (and config) edited."""
    dst.mkdir(parents=True)
    tensors = load_file(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    edit(tensors, config)
    save_file({k: v.contiguous() for k, v in tensors.items()}, dst / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_e2m1_codes_and_the_nibble_order() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    packed = codes[0::2] | (codes[1::2] << 4)  # the first value of each pair in the low nibble
    assert unpack_e2m1(packed).tolist() == list(E2M1)
    grid = torch.tensor(E2M1)
    assert torch.equal(quant_release.e2m1_codes(grid), codes.masked_fill(codes == 8, 0))  # -0 is stored as 0


def test_mxfp4_block_scale_is_the_spec_shared_exponent() -> None:
    w = torch.tensor([[6.0, -3.0, 0.5, 1.5] * 8, [0.75, 0.25, -0.125, 0.0] * 8])  # amax 6 -> 2^0; 0.75 -> 2^-3
    parts = quantize_mxfp4(w)
    assert parts["scale"].tolist() == [[127], [124]]
    assert torch.equal(Mxfp4().dequantize(parts, (2, 32)), w)  # on the E2M1 grid: exact
    assert parts["values"].shape == (2, 1, 16) and parts["values"].dtype == torch.uint8


def test_nvfp4_scales_and_round_trip() -> None:
    w = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
    parts = quantize_nvfp4(w)
    assert parts["scale"].dtype == torch.float8_e4m3fn and parts["scale"].shape == (8, 2)
    assert float(parts["global_scale"]) == pytest.approx(float(w.abs().max()) / (6 * 448))
    deq = Nvfp4().dequantize(parts, (8, 32))
    assert (deq - w).norm() < 0.15 * w.norm()  # 4-bit rounding
    assert float(deq.abs().max()) == pytest.approx(float(w.abs().max()), rel=0.07)


@pytest.mark.parametrize("fmt", QUANT_CHOICES)
def test_loads_strictly_and_reports_the_bytes_it_takes(releases, fmt: str) -> None:  # noqa: ANN001
    result = load_model(releases[fmt], dtype="float32")
    quant = result.report["quant"]
    stored = load_file(releases[fmt] / "model.safetensors")
    config = json.loads((releases[fmt] / "config.json").read_text())
    assert result.report["ok"] and quant["format"] == FORMAT_NAME[fmt] and quant["mode"] == "emulated"
    assert quant["how"].startswith("dequantized at load") and quant["device_has_type"] is False
    linears = [n for n in load_file(next(cached_model("llama").glob("*.safetensors"))) if "layers." in n]
    params = dict(result.model.named_parameters())
    assert quant["tensors"] == config["num_hidden_layers"] * 7 > 0
    assert quant["runtime_bytes"] == 4 * sum(p.numel() for n, p in params.items() if "proj" in n)
    packed = sum(t.numel() * t.element_size() for n, t in stored.items()
                 if not n.endswith("layernorm.weight") and n.startswith("model.layers."))
    assert quant["bytes"] == packed and quant["runtime_bytes"] > (3 if "fp8" in fmt else 6) * packed
    assert linears  # the original has the layers the release quantised
    assert checkpoint_format(config)[0] == quant["format"]  # the planner counts the format the loader loads


def test_the_planner_reads_modelopt_fp8_as_per_tensor() -> None:
    config = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
    assert checkpoint_format(config) == ("float8_e4m3fn-tensor", False)


@pytest.mark.parametrize("fmt", QUANT_CHOICES)
def test_weights_equal_the_independent_dequantisation(releases, fmt: str) -> None:  # noqa: ANN001
    ours = load_model(releases[fmt], dtype="float32").model
    ref = dequantized_reference(releases[fmt], json.loads((releases[fmt] / "config.json").read_text()))
    theirs = ref.state_dict()
    for name, p in ours.named_parameters():
        if "qkv_proj" in name or "gate_up_proj" in name:
            continue  # merged in the runtime; their parts are compared through the logits below
        torch.testing.assert_close(p, theirs[name], rtol=1e-6, atol=1e-8, msg=name)


@pytest.mark.parametrize("fmt", QUANT_CHOICES)
def test_greedy_tokens_equal_transformers(releases, fmt: str) -> None:  # noqa: ANN001
    """FP8: transformers' own compressed-tensors loader. MXFP4 / NVFP4 on a llama: transformers has no loader of
    those (its MXFP4 is gpt-oss's experts only, NVFP4 modelopt none), so the dequantised reference."""
    from transformers import AutoModelForCausalLM

    ours = greedy_decode(load_model(releases[fmt], dtype="float32").model, PROMPTS, 10, block_size=16)
    if fmt.startswith("fp8"):
        ref = AutoModelForCausalLM.from_pretrained(releases[fmt], dtype=torch.float32).eval()
    else:
        ref = dequantized_reference(releases[fmt], json.loads((releases[fmt] / "config.json").read_text()))
    with torch.no_grad():
        for prompt, tokens in zip(PROMPTS, ours, strict=True):
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None)
            assert tokens == out[0, len(prompt):].tolist()


def test_quantised_experts_load(tmp_path: Path) -> None:
    """Routed experts (qwen3-moe): each expert's linears quantised, the router not."""
    result = load_model(quantize_release(cached_model("qwen3-moe"), "nvfp4", tmp_path / "q"), dtype="float32")
    stored = load_file(tmp_path / "q" / "model.safetensors")
    assert result.report["quant"]["tensors"] == sum(1 for n in stored if n.endswith(".weight_scale_2"))
    assert any(".experts.3." in n for n in stored if n.endswith("weight_scale")) and not any(
        "mlp.gate.weight_scale" in n for n in stored)


Q = "model.layers.0.self_attn.q_proj.weight"
DOWN = "model.layers.1.mlp.down_proj"


@pytest.mark.parametrize(("fmt", "edit", "message"), [
    ("mxfp4", lambda t, c: t.update({f"{Q}_scales": t[f"{Q}_scales"].T}),
     rf"tensor '{Q}_scales' \(MXFP4 E8M0 scale per 32 values\) has shape \[2, 64\], expected \[64, 2\]"),
    ("nvfp4", lambda t, c: t.update({f"{DOWN}.weight_scale": t[f"{DOWN}.weight_scale"][:, :-1].repeat(1, 2)}),
     rf"tensor '{DOWN}.weight_scale' \(NVFP4 FP8 E4M3 scale per 16 values\) has shape \[64, 14\], expected \[64, 8\]"),
    ("nvfp4", lambda t, c: t.update({f"{DOWN}.weight_scale": t[f"{DOWN}.weight_scale"].float()}),
     rf"'{DOWN}.weight_scale' .* has dtype F32, expected F8_E4M3: the runtime cannot run it as NVFP4"),
    ("fp8-channel", lambda t, c: t.update({f"{DOWN}.weight_scale": t[f"{DOWN}.weight_scale"].T}),
     rf"'{DOWN}.weight_scale' \(FP8 per channel weight scale\) has shape \[1, 64\], expected \[64, 1\]"),
    ("fp8-tensor", lambda t, c: t.pop(f"{DOWN}.weight_scale"),
     rf"FP8 per tensor weight '{DOWN}.weight' lacks its tensor '{DOWN}.weight_scale'"),
    ("mxfp4", lambda t, c: t.update({f"{DOWN}.weight": torch.zeros(64, 128)}),
     rf"unexpected tensor '{DOWN}.weight'|'{DOWN}.weight' is stored unquantised"),
    ("nvfp4", lambda t, c: c["quantization_config"].update(group_size=32),
     r"config.json: quantization_config.group_size 32: NVFP4 blocks are 16"),
    ("fp8-tensor", lambda t, c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        strategy="block"), r"config.json: quantization_config: FP8 weights with strategy 'block' are not supported"),
    ("nvfp4", lambda t, c: c["quantization_config"].update(kv_cache_quant_algo="FP8"),
     r"kv_cache_quant_algo 'FP8' \(modelopt\) is not supported"),
    ("nvfp4", lambda t, c: c["quantization_config"].update(quant_algo="W4A8_AWQ"),
     r"quant_algo 'W4A8_AWQ' \(modelopt\) is not supported"),
])
def test_a_planted_scale_error_or_unsupported_layout_is_refused_naming_tensor_and_format(
        releases, tmp_path: Path, fmt: str, edit, message: str) -> None:  # noqa: ANN001
    with pytest.raises(LoadError, match=message):
        load_model(edited(releases[fmt], tmp_path / "bad", edit), dtype="float32")


def test_make_model_quant_keeps_the_original_beside_it(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from agents.runtime.testing.int_models import INT_WRITERS

    assert make_model_command.QUANT_CHOICES == QUANT_CHOICES + tuple(INT_WRITERS)  # float formats, then integer
    args = argparse.Namespace(arch="llama", real=None, quant="mxfp4", size="tiny", seed=3, dtype="float32",
                              out=tmp_path / "m")
    assert make_model_command.handle(args) == 0
    assert "quantised as mxfp4" in capsys.readouterr().out
    info = json.loads((tmp_path / "m" / "quantization.json").read_text())
    assert info["format"] == "mxfp4" and info["original"] == "original"
    quantised, original = load_model(tmp_path / "m"), load_model(tmp_path / "m" / "original")
    assert "quant" in quantised.report and "quant" not in original.report
    q, o = dict(quantised.model.named_parameters()), dict(original.model.named_parameters())
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(q[name], o[name]) and (q[name] - o[name]).norm() < 0.2 * o[name].norm()
    again = tmp_path / "again"
    args.out = again
    assert make_model_command.handle(args) == 0  # deterministic: the same bytes from the same seed
    assert (again / "model.safetensors").read_bytes() == (tmp_path / "m" / "model.safetensors").read_bytes()
    args.real, args.arch = "smollm2-135m", None
    assert make_model_command.handle(args) == 2


def test_excluded_modules_dotted_globs_and_regexes() -> None:
    fmt = Mxfp4(("model.layers.*.self_attn", "lm_head", "re:.*mlp.gate$"))
    kept = ["model.layers.3.self_attn.q_proj.weight", "lm_head.weight", "model.layers.0.mlp.gate.weight"]
    converted = ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight"]
    assert not any(fmt.converts(n) for n in kept) and all(fmt.converts(n) for n in converted)
