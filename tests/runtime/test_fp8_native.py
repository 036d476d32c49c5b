"""Native FP8 (``layers/fp8_native.py``): FP8 per-tensor / per-channel releases held in memory as E4M3 with fp32
row scales and multiplied W8A8 through ``torch._scaled_mm`` (it runs on this CPU), against the same release
dequantised at load (emulated): greedy tokens equal, logits within the activation quantisation's error, the
parameters FP8, TP slices of the values and the scales, the load report's mode and bytes, and a forced native
mode refused on a format without a native path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from agents.runtime.distributed import set_parallel_state
from agents.runtime.layers.fp8_native import FP8, fp8_linear, mode_for, quantize_rows
from agents.runtime.loader import LoadError, load_model
from agents.runtime.models.simple_decode import PagedCache, greedy_decode, prefill_context
from agents.runtime.testing.make_model import cached_model
from agents.runtime.testing.quant_release import quantize_release

PROMPTS = [[1, 17, 93, 250, 4, 77], [1, 300, 12]]
# W8A8 against the emulated path (same FP8 weights, fp32 activations): per-token E4M3 activations add a relative
# error of about 2^-4 per product before accumulation; measured here up to ~1.5 % of the logits' range
LOGIT_REL_TOL = 0.05


@pytest.fixture(autouse=True)
def checksum_cache(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("DAY0_CHECKSUM_CACHE", str(tmp_path / "sha256-cache.json"))


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:  # noqa: ANN001
    root = tmp_path_factory.mktemp("fp8-native")
    src = cached_model("llama")
    out = {fmt: quantize_release(src, fmt, root / fmt) for fmt in ("fp8-tensor", "fp8-channel", "mxfp4")}
    out["original"] = src
    return out


@torch.inference_mode()
def prefill_logits(model, ids: list[int]) -> torch.Tensor:  # noqa: ANN001
    cache = PagedCache(model, len(ids), 1)
    ctx, positions = prefill_context(cache, [0], [0], [len(ids)])
    return model.compute_logits(model.forward(torch.tensor(ids), positions, ctx).hidden).float()  # [T, vocab]


def test_fp8_linear_is_w8a8_of_the_dequantized_weight() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=gen)
    scale = w.abs().amax(1) / 448
    wq = (w / scale[:, None]).to(FP8)
    wq.fp8_scale = scale
    x = torch.randn(5, 64, generator=gen)
    xq, xs = quantize_rows(x)
    exact = (xq.float() * xs) @ (wq.float() * scale[:, None]).t()  # the same quantised operands in fp32
    assert torch.allclose(fp8_linear(x, wq), exact, rtol=1e-5, atol=1e-5)
    emulated = x @ (wq.float() * scale[:, None]).t()
    assert (fp8_linear(x, wq) - emulated).abs().max() < 0.05 * emulated.abs().max()  # the activations' rounding
    assert fp8_linear(x.bfloat16(), wq).dtype == torch.bfloat16


@pytest.mark.parametrize("fmt", ["fp8-tensor", "fp8-channel"])
def test_native_matches_the_emulated_release(releases: dict[str, Path], fmt: str) -> None:
    emulated = load_model(releases[fmt], quant_mode="emulated")
    native = load_model(releases[fmt], quant_mode="native")
    quant = native.report["quant"]
    assert emulated.report["quant"]["mode"] == "emulated" and quant["mode"] == "native"
    assert quant["native_tensors"] == quant["tensors"] == 14 and "emulated_tensors" not in quant
    held = {n: p for n, p in native.model.named_parameters() if p.dtype == FP8}
    assert len(held) == 8 and all(n.endswith(("qkv_proj.weight", "o_proj.weight", "gate_up_proj.weight",
                                               "down_proj.weight")) for n in held)
    assert quant["runtime_bytes"] == sum(p.numel() + 4 * p.shape[0] for p in held.values())
    assert quant["runtime_bytes"] < emulated.report["quant"]["runtime_bytes"] / 3  # fp32 there
    ref = dict(emulated.model.named_parameters())
    for name, p in held.items():  # the stored FP8 values and their scales are the emulated weight exactly
        assert torch.equal(p.float() * p.fp8_scale[:, None], ref[name])
    ours, theirs = greedy_decode(native.model, PROMPTS, 8), greedy_decode(emulated.model, PROMPTS, 8)
    # a random-weight model's logits span ~0.6 with top-2 margins down to 0.002: near-ties a W8A8 error of ~0.01
    # may flip, after which greedy continuations part. So: the first token equal, and teacher-forced on the
    # emulated continuation every step whose margin exceeds twice that step's logit error picks the same token
    assert [t[0] for t in ours] == [t[0] for t in theirs]
    agree = steps = 0
    for ids, tokens in zip(PROMPTS, theirs, strict=True):
        a, b = prefill_logits(native.model, ids + tokens), prefill_logits(emulated.model, ids + tokens)
        err = (a - b).abs().amax(-1)  # [T]
        assert float(err.max()) <= LOGIT_REL_TOL * float(b.abs().max())
        top2 = b.topk(2, dim=-1).values
        decided = (top2[:, 0] - top2[:, 1]) > 2 * err  # a margin the W8A8 error cannot flip
        assert torch.equal(a.argmax(-1)[decided], b.argmax(-1)[decided])
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        steps += len(ids + tokens)
    assert agree >= 0.8 * steps  # measured 24/25 (per tensor) and 22/25 (per channel): the rest near-ties


def test_auto_mode_follows_the_hardware(releases: dict[str, Path]) -> None:
    assert load_model(releases["fp8-channel"]).report["quant"]["mode"] == "emulated"  # CPU, no hardware named
    declared = load_model(releases["fp8-channel"], hardware_declares=True).report["quant"]
    assert declared["mode"] == "native" and declared["device_has_type"] is False
    assert mode_for("float8_e4m3fn-tensor", "auto", None, True) == "native"
    assert mode_for("mxfp4", "auto", True, True) == "emulated"
    assert load_model(releases["mxfp4"], hardware_declares=True).report["quant"]["mode"] == "emulated"


@pytest.mark.parametrize(("release", "named"), [("mxfp4", "FP4 (mxfp4)"), ("original", "an unquantised release")])
def test_forced_native_without_a_native_path_is_refused(releases: dict[str, Path], release: str,
                                                        named: str) -> None:
    with pytest.raises(LoadError, match=re.escape(f"--quant-mode native: {named} has no native path in the runtime")):
        load_model(releases[release], quant_mode="native")
    with pytest.raises(LoadError, match="quant mode 'fast'"):
        load_model(releases["fp8-tensor"], quant_mode="fast")


def test_tp_ranks_hold_their_slices_of_values_and_scales(releases: dict[str, Path]) -> None:
    whole = dict(load_model(releases["fp8-tensor"], quant_mode="native").model.named_parameters())
    try:
        ranks = []
        for rank in range(2):
            set_parallel_state(2, 1, rank)  # sizes only (no process group): each rank's own slices
            ranks.append(dict(load_model(releases["fp8-tensor"], quant_mode="native").model.named_parameters()))
    finally:
        set_parallel_state(1, 1, 0)
    for name, p in whole.items():
        if p.dtype != FP8:
            continue
        parts = [r[name] for r in ranks]
        assert all(q.dtype == FP8 for q in parts)
        if name.endswith(("o_proj.weight", "down_proj.weight")):  # row parallel: input columns split, all rows
            assert torch.equal(torch.cat([q.float() for q in parts], 1), p.float())
            assert all(torch.equal(q.fp8_scale, p.fp8_scale) for q in parts)
        else:  # column parallel: each rank's rows of every shard (q/k/v, gate/up), their scales with them
            rows = {q.shape[0] for q in parts}
            assert rows == {p.shape[0] // 2}
            got = torch.cat([q.float() * q.fp8_scale[:, None] for q in parts])
            assert sorted(got.sum(1).tolist()) == pytest.approx(sorted((p.float() * p.fp8_scale[:, None]).sum(1).tolist()))


def test_the_engine_serves_native_fp8_with_packing_left_to_fp32_weights(releases: dict[str, Path]) -> None:
    """``day0 serve --quant-mode native`` (EngineConfig.quant_mode): the engine's model holds FP8 weights, its
    load report says native, and ``--pack-weights`` (on for fp32 CPU serving) leaves them as they are."""
    from agents.runtime.engine import LLMEngine, SamplingParams

    engine = LLMEngine(releases["fp8-channel"], num_blocks=32, quant_mode="native", pack_weights=True)
    assert engine.load_report["quant"]["mode"] == "native"
    assert sum(p.dtype == FP8 for p in engine.model.parameters()) == 8
    out = engine.generate([[1, 17, 93, 250, 4, 77]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].output_token_ids) == 4
    with pytest.raises(ValueError, match="quant_mode must be auto, native or emulated"):
        LLMEngine(releases["fp8-channel"], quant_mode="fp8")


def test_fused_experts_stay_emulated_and_are_named(tmp_path: Path) -> None:
    """A MoE release in native mode: attention in FP8, the fused routed experts dequantised (no grouped W8A8
    kernel), the report naming them and counting both kinds of bytes."""
    release = quantize_release(cached_model("qwen3-moe"), "fp8-channel", tmp_path / "moe")
    native, emulated = load_model(release, quant_mode="native"), load_model(release, quant_mode="emulated")
    quant = native.report["quant"]
    assert quant["mode"] == "native" and quant["native_tensors"] == 8 and quant["tensors"] == 56
    assert all(".mlp.experts." in name for name in quant["emulated_tensors"])
    assert "48 tensors dequantized at load to float32" in quant["how"]
    fp32_experts = sum(p.numel() * 4 for n, p in native.model.named_parameters() if ".experts." in n)
    fp8 = sum(p.numel() + 4 * p.shape[0] for p in native.model.parameters() if p.dtype == FP8)
    assert quant["runtime_bytes"] == fp32_experts + fp8
    assert greedy_decode(native.model, [[1, 17, 93, 250]], 1) == greedy_decode(emulated.model, [[1, 17, 93, 250]], 1)
