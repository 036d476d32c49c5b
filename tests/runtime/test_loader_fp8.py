"""Block-scaled FP8 checkpoints (DeepSeek-V3 / Kimi-K2 layout): a tiny model's linear weights are quantised per
block into ``weight`` (float8_e4m3fn) + ``weight_scale_inv`` (fp32); the runtime loads that copy strictly and
equals the runtime and ``transformers`` on the dequantised (reference) weights, on one rank and on two."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agents.runtime.context import ForwardContext
from agents.runtime.layers.quant import dequantize_block_fp8, quantize_block_fp8
from agents.runtime.loader import LoadError, load_model
from agents.runtime.testing.make_model import cached_model

BLOCK = (16, 24)  # small blocks for tiny models; 24 leaves partial blocks and crosses the TP=2 split of 64
LENGTHS = [5, 11, 3]
UNQUANTISED = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight")  # as DeepSeek-V3 ships them


@pytest.fixture(autouse=True)
def checksum_cache(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("DAY0_CHECKSUM_CACHE", str(tmp_path / "sha256-cache.json"))


def quantised(name: str, t: torch.Tensor) -> bool:
    return t.dim() == 2 and name.endswith(".weight") and not any(k in name for k in UNQUANTISED)


def dequantise_by_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """An independent reference: block by block, edges clipped."""
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            rows, cols = slice(i * BLOCK[0], (i + 1) * BLOCK[0]), slice(j * BLOCK[1], (j + 1) * BLOCK[1])
            out[rows, cols] = q[rows, cols].float() * scale[i, j]
    return out


def convert(src: Path, dst: Path, *, fp8: bool, dtype: torch.dtype | None = None,
            edit: Callable[[dict[str, torch.Tensor], dict], None] | None = None) -> Path:
    """A copy of ``src`` as one ``model.safetensors``: with ``fp8`` its linear weights block-quantised (plus scales
    and the quantization_config); without, the same weights dequantised (the reference). ``dtype`` casts the
    unquantised tensors (fp32 ``e_score_correction_bias`` kept, as bf16 releases do)."""
    dst.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(shard))
    out: dict[str, torch.Tensor] = {}
    for name, t in sorted(tensors.items()):
        if quantised(name, t):
            q, scale = quantize_block_fp8(t, BLOCK)
            if fp8:
                out[name], out[f"{name}_scale_inv"] = q, scale
                continue
            deq = dequantise_by_blocks(q, scale)
            assert torch.equal(deq, dequantize_block_fp8(q, scale, BLOCK, torch.float32)), name
            assert (deq - t).norm() < 0.05 * t.norm(), name  # fp8 rounding only
            t = deq
        keep = name.endswith("e_score_correction_bias")
        out[name] = t if dtype is None or keep else t.to(dtype)
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    if fp8:
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                         "weight_block_size": list(BLOCK)}
    if edit is not None:
        edit(out, config)
    save_file({k: v.contiguous() for k, v in out.items()}, dst / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def kimi_like(out: Path) -> Path:
    """The tiny DeepSeek-V3 with Kimi-K2's attention choice (no q LoRA: a plain ``q_proj``), one expert group."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((cached_model("deepseek-v3") / "config.json").read_text())
    config.update(q_lora_rank=None, n_group=1, topk_group=1)
    torch.manual_seed(0)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    AutoModelForCausalLM.from_config(hf_config).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["q_lora_rank"] is None
    return out


@pytest.fixture(scope="module", params=["llama", "deepseek-v3", "kimi-k2"])
def dirs(request, tmp_path_factory) -> tuple[Path, Path]:  # noqa: ANN001
    root = tmp_path_factory.mktemp(f"fp8-{request.param}")
    src = kimi_like(root / "src") if request.param == "kimi-k2" else cached_model(request.param)
    return convert(src, root / "fp8", fp8=True), convert(src, root / "ref", fp8=False)


def prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (sum(LENGTHS),), generator=torch.Generator().manual_seed(5))
    return ids, torch.cat([torch.arange(n) for n in LENGTHS])


def run_logits(model) -> torch.Tensor:  # noqa: ANN001
    ids, positions = prompts(model.config["vocab_size"])
    out = model(ids, positions, ForwardContext.for_prompts(LENGTHS))
    return model.compute_logits(out.hidden)  # [T, vocab]


def test_fp8_checkpoint_equals_the_dequantised_weights_in_the_runtime_and_transformers(dirs) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    fp8_dir, ref_dir = dirs
    fp8, ref = load_model(fp8_dir, dtype="float32"), load_model(ref_dir, dtype="float32")
    assert fp8.report["ok"] and fp8.report["path"] == "native"
    names = [n for n in load_file(fp8_dir / "model.safetensors") if n.endswith("_scale_inv")]
    assert fp8.report["fp8_tensors"] == len(names) > 0 and ref.report["fp8_tensors"] == 0
    for name in (n.removesuffix("_scale_inv") for n in names):  # stats of the dequantised values
        assert fp8.report["stats"][name] == pytest.approx(ref.report["stats"][name], rel=1e-6, abs=1e-9)
    ref_params = dict(ref.model.named_parameters())
    for name, p in fp8.model.named_parameters():
        assert torch.equal(p, ref_params[name]), name  # dequantised exactly as the reference was written
    logits = run_logits(fp8.model)
    torch.testing.assert_close(logits, run_logits(ref.model), rtol=0, atol=1e-6)
    hf = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    ids, _ = prompts(fp8.config["vocab_size"])
    start = 0
    for n in LENGTHS:
        with torch.no_grad():
            theirs = hf(ids[start : start + n][None]).logits[0]  # [n, vocab]
        torch.testing.assert_close(logits[start : start + n], theirs, rtol=0, atol=1e-4)
        start += n


def test_bf16_release_layout_loads(tmp_path: Path) -> None:
    """As DeepSeek-V3 ships: bf16 config, FP8 linears with fp32 scales, an fp32 score-correction bias and a bf16
    router; loaded in bf16 the parameters equal the reference dequantised in fp32 then rounded to bf16."""
    src = cached_model("deepseek-v3")
    fp8 = load_model(convert(src, tmp_path / "fp8", fp8=True, dtype=torch.bfloat16), dtype="bfloat16")
    ref = load_model(convert(src, tmp_path / "ref", fp8=False, dtype=torch.bfloat16), dtype="bfloat16")
    assert fp8.report["ok"] and fp8.report["fp8_tensors"] > 0
    ref_params = dict(ref.model.named_parameters())
    for name, p in fp8.model.named_parameters():
        assert torch.equal(p, ref_params[name]), name
    bias_name = "model.layers.1.mlp.gate.e_score_correction_bias"
    bias = dict(fp8.model.named_parameters())[bias_name]
    stored = load_file(src / json.loads((src / "model.safetensors.index.json").read_text())["weight_map"][bias_name])
    assert bias.dtype == torch.float32 and torch.equal(bias, stored[bias_name])  # not rounded through bf16
    torch.testing.assert_close(run_logits(fp8.model), run_logits(ref.model), rtol=0, atol=0)


def test_fp32_correction_bias_in_a_bf16_checkpoint_loads(tmp_path: Path) -> None:
    model_dir = convert(cached_model("deepseek-v3"), tmp_path / "bf16", fp8=False, dtype=torch.bfloat16)
    header = load_file(model_dir / "model.safetensors")
    assert header["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert header["model.layers.1.mlp.gate.weight"].dtype == torch.bfloat16
    assert load_model(model_dir, dtype="bfloat16").report["ok"]


def _tp_logits(model_dir: str) -> torch.Tensor:
    return run_logits(load_model(model_dir, dtype="float32").model)


@pytest.mark.parametrize("dirs", ["llama", "deepseek-v3", "kimi-k2"],
                         indirect=True)
@pytest.mark.slow
def test_tensor_parallel_fp8_equals_one_rank(dirs) -> None:  # noqa: ANN001
    """Each rank dequantises and takes its slice: blocks of 24 straddle the split of 64 inputs at 32."""
    from agents.runtime.distributed import launch

    fp8_dir, _ = dirs
    single = _tp_logits(str(fp8_dir))
    ranks = launch(_tp_logits, 2, str(fp8_dir), timeout=240)
    for got in ranks:
        torch.testing.assert_close(got, single, rtol=0, atol=1e-5)


def _llama_fp8(tmp: Path, edit: Callable[[dict[str, torch.Tensor], dict], None]) -> Path:
    return convert(cached_model("llama"), tmp / "bad", fp8=True, edit=edit)


def test_missing_scale_is_refused_naming_both_tensors(tmp_path: Path) -> None:
    name = "model.layers.0.mlp.down_proj.weight"
    model_dir = _llama_fp8(tmp_path, lambda t, c: t.pop(f"{name}_scale_inv"))
    with pytest.raises(LoadError, match=rf"model.safetensors: FP8 tensor '{name}' has no scale tensor "
                                        rf"'{name}_scale_inv'"):
        load_model(model_dir)


def test_scale_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    name = "model.layers.1.self_attn.k_proj.weight"  # [32, 64] in 16×24 blocks: [2, 3]

    def edit(t: dict[str, torch.Tensor], _c: dict) -> None:
        t[f"{name}_scale_inv"] = torch.ones(2, 4)

    with pytest.raises(LoadError, match=rf"scale tensor '{name}_scale_inv' has shape \[2, 4\], expected \[2, 3\]"):
        load_model(_llama_fp8(tmp_path, edit))


def test_fp8_where_the_model_expects_none_is_refused(tmp_path: Path) -> None:
    def fp8_head(t: dict[str, torch.Tensor], _c: dict) -> None:
        t["lm_head.weight"], t["lm_head.weight_scale_inv"] = quantize_block_fp8(t["lm_head.weight"], BLOCK)

    with pytest.raises(LoadError, match=r"tensor 'lm_head.weight' has dtype F8_E4M3, .*expects no FP8 tensor"):
        load_model(_llama_fp8(tmp_path / "head", fp8_head))

    def no_quant_config(_t: dict[str, torch.Tensor], c: dict) -> None:
        del c["quantization_config"]

    with pytest.raises(LoadError, match=r"tensor 'model.layers.0.mlp.down_proj.weight' has dtype F8_E4M3, "
                                        r".*config.json has no fp8 quantization_config"):
        load_model(_llama_fp8(tmp_path / "noconfig", no_quant_config))


def test_scale_beside_an_unquantised_weight_is_refused(tmp_path: Path) -> None:
    name = "model.layers.0.self_attn.o_proj.weight"

    def edit(t: dict[str, torch.Tensor], _c: dict) -> None:
        t[name] = dequantize_block_fp8(t[name], t[f"{name}_scale_inv"], BLOCK, torch.float32)

    with pytest.raises(LoadError, match=rf"scale tensor '{name}_scale_inv' accompanies '{name}', which is stored "
                                        r"as F32, not FP8"):
        load_model(_llama_fp8(tmp_path, edit))


def test_fp8_without_block_size_is_refused(tmp_path: Path) -> None:
    def edit(_t: dict[str, torch.Tensor], c: dict) -> None:
        del c["quantization_config"]["weight_block_size"]

    with pytest.raises(LoadError, match="config.json: quantization_config: fp8 without 'weight_block_size'"):
        load_model(_llama_fp8(tmp_path, edit))


def test_other_quantisation_methods_are_refused_by_name(tmp_path: Path) -> None:
    def edit(_t: dict[str, torch.Tensor], c: dict) -> None:
        c["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}  # (AWQ loads now)

    with pytest.raises(LoadError, match="config.json: quantization_config.quant_method 'bitsandbytes' is not "
                                        "supported"):
        load_model(_llama_fp8(tmp_path, edit))


def test_estimate_auto_plans_the_checkpoints_fp8_bytes() -> None:
    from contract.hardware import load_model_catalog
    from contract.planner import plan_report

    config = next(m["config"] for m in load_model_catalog() if m["slug"] == "deepseek-v3")
    assert config["quantization_config"]["quant_method"] == "fp8"
    plan = {d: plan_report(config, memory_bytes=141 << 30, devices_per_node=8, dtype=d)
            for d in ("auto", "fp8", "bfloat16")}
    assert plan["auto"]["weight_bytes"] == plan["fp8"]["weight_bytes"]
    assert plan["auto"]["weight_bytes"] < 0.55 * plan["bfloat16"]["weight_bytes"]


def test_fp8_checkpoint_of_a_fallback_architecture_is_refused_by_name(tmp_path: Path) -> None:
    """The generic fallback declares no FP8 storage: such a checkpoint is refused up front, not mis-loaded."""
    import transformers

    cfg = transformers.GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    transformers.GPTNeoXForCausalLM(cfg).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": list(BLOCK)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match="config.json: the checkpoint is FP8-quantised, which the fallback path of "
                                        "'GPTNeoXForCausalLM' cannot load"):
        load_model(tmp_path)
