"""Align on a quantised release: the reference is transformers on the weights dequantised independently of the
runtime (``loader/quant_reference.py``), so a correct release aligns, and a planted fault in the runtime's
dequantisation (scales read transposed, a group size off by one) fails the layer that holds it and not before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents.pipeline.runner import run_pipeline
from agents.runtime.layers.quant_float import Mxfp4, Nvfp4, unpack_e2m1
from agents.runtime.layers.quant_formats import QuantizedTensor
from agents.runtime.testing.make_model import cached_model
from agents.runtime.testing.quant_release import quantize_release

FAULTY_LAYER = 1  # the tiny llama has two
# The reference holds the same numbers, so a correct runtime agrees to fp32 rounding (~1e-7): the job gates the
# layers' max relative error too. The cosine gate (0.99) alone misses the off-by-one group (cosine 0.995 there).
GATE = {"layer_max_rel_err": 1e-3}
# A native FP8 (W8A8) path quantises activations per token to E4M3 (3 mantissa bits): against the same weights in
# fp32 its ops measure max relative error <= 0.044 and cosine >= 0.9990, its layers cosine >= 0.9993, the KV
# check (1,023 tokens) 0.0063 relative. The gates such a job needs (docs/quantized.md); the defaults (0.01,
# 0.999, 1e-5) are fp32 rounding's, and layer_cosine 0.99 and the token match 0.9 hold unchanged
W8A8_GATE = {"op_max_rel_err": 0.1, "op_cosine": 0.998, "kv_cache_max_rel_err": 0.02}


def scales_transposed(parts: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    """MXFP4 with the scale matrix read column-major (as a kernel that indexes it transposed would)."""
    scale = parts["scale"].T.contiguous().view(parts["scale"].shape)
    return Mxfp4().dequantize({**parts, "scale": scale}, shape)


def group_off_by_one(parts: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    """NVFP4 with each block scale applied to 17 values instead of 16."""
    rows, cols = shape
    values = unpack_e2m1(parts["values"]).view(rows, cols)
    scale = parts["scale"].float() * parts["global_scale"].float()
    block = (torch.arange(cols) // (Nvfp4.block + 1)).clamp(max=scale.shape[1] - 1)
    return values * scale[:, block]


@pytest.fixture(autouse=True)
def checksum_cache(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("DAY0_CHECKSUM_CACHE", str(tmp_path / "sha256-cache.json"))


@pytest.mark.parametrize(("fmt", "fault"), [("mxfp4", scales_transposed), ("nvfp4", group_off_by_one)])
def test_a_planted_scale_fault_fails_align_at_its_layer(make_ctx, tmp_path: Path, monkeypatch, fmt: str,
                                                        fault) -> None:  # noqa: ANN001
    release = quantize_release(cached_model("llama"), fmt, tmp_path / fmt)
    ctx, _ = make_ctx(release, thresholds=GATE)
    report = run_pipeline(ctx, "load,align")
    assert report["stages"]["load"]["quant"]["format"] == fmt
    assert report["stages"]["load"]["quant"]["hardware_declares"] is False  # the cpu hardware declares no fp4
    layers = report["stages"]["align"]["layers"]
    assert report["failed_stage"] is None, report["error"]
    assert [row["passed"] for row in layers] == [True, True] and min(r["cosine"] for r in layers) > 0.99999

    honest = QuantizedTensor.dequantize

    def planted(self: QuantizedTensor, dtype: torch.dtype, device=None) -> torch.Tensor:  # noqa: ANN001
        if f"layers.{FAULTY_LAYER}." not in self.name:
            return honest(self, dtype, device)
        self.dequantized = fault(self.parts, self.spec.shape).to(dtype)
        return self.dequantized

    monkeypatch.setattr(QuantizedTensor, "dequantize", planted)
    ctx, _ = make_ctx(release, thresholds=GATE)
    report = run_pipeline(ctx, "load,align")
    assert report["failed_stage"] == "align", report["stages"]["align"]["layers"]
    layers = report["stages"]["align"]["layers"]
    assert [row["passed"] for row in layers] == [True, False], layers
    assert layers[0]["max_rel_err"] < 1e-5 and layers[1]["max_rel_err"] > GATE["layer_max_rel_err"]


@pytest.mark.slow
def test_every_default_stage_runs_on_a_quantised_release_on_cpu(make_ctx, tmp_path: Path) -> None:
    """The issue's 'done when', agent side: a job on an NVFP4 release (emulated on the CPU) passes every default
    stage; its load section says how it ran."""
    release = quantize_release(cached_model("llama"), "nvfp4", tmp_path / "nvfp4")
    ctx, _ = make_ctx(release, thresholds=GATE)
    report = run_pipeline(ctx, "plan,load,inventory,align,serve,bench,env")
    assert report["failed_stage"] is None, report["error"]
    assert report["tier"] >= 5
    quant = report["stages"]["load"]["quant"]
    assert quant["format"] == "nvfp4" and quant["mode"] == "emulated" and quant["device_has_type"] is False


@pytest.mark.parametrize("fmt", ["fp8-tensor", "fp8-channel"])
def test_a_native_fp8_release_aligns_against_the_dequantized_reference(make_ctx, tmp_path: Path, fmt: str) -> None:
    """Forced native (``--quant-mode native``): FP8 weights, W8A8 matmuls, against transformers on the same weights
    dequantised in fp32. The activations' per-token E4M3 rounding is the path's own error, so the fp32-rounding
    gates are not the ones a W8A8 path meets: ``W8A8_GATE``."""
    release = quantize_release(cached_model("llama"), fmt, tmp_path / fmt)
    ctx, _ = make_ctx(release, quant_mode="native", thresholds=W8A8_GATE)
    report = run_pipeline(ctx, "load,align")
    assert report["failed_stage"] is None, report["error"]
    assert report["stages"]["load"]["quant"]["mode"] == "native"
    align = report["stages"]["align"]
    assert all(row["passed"] for row in align["layers"]) and min(r["cosine"] for r in align["layers"]) > 0.999
    linears = [row for row in align["ops"] if row["op"].startswith("linear")]
    assert linears and all("aten._scaled_mm.default" in row["aten_ops"] for row in linears)  # W8A8 ran
    assert max(row["max_rel_err"] for row in linears) > 1e-3  # the activation rounding is really there
    assert align["e2e"]["token_match_rate"] >= 0.9
