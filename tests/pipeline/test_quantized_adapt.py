"""`day0 adapt` on quantised releases on CPU (emulated): integer formats (GPTQ with act-order, compressed-tensors
INT4, AWQ) plan in their own format, load dequantised and align against transformers on the dequantised weights;
a GGUF-only directory gets its config (and its GGUF type, which the planner counts) from the file's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.pipeline.commands import _load_job
from agents.runtime.testing import int_models
from agents.runtime.testing.make_model import cached_model
from contract.planner import plan_report
from day0cli.main import main

WRITERS = {"gptq": lambda s, o: int_models.write_gptq(s, o, act_order=True, symmetric=False),
           "ct-int4": lambda s, o: int_models.write_compressed_tensors(s, o, symmetric=False),
           "awq": lambda s, o: int_models.write_awq(s, o)}


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_an_integer_release_plans_loads_and_aligns_emulated(fmt: str, tmp_path: Path) -> None:
    release, _ = WRITERS[fmt](cached_model("llama"), tmp_path / "release")
    report_file = tmp_path / "report.json"
    rc = main(["adapt", str(release), "--hardware", "cpu", "--stages", "plan,load,align", "--report",
               str(report_file), "--quiet"])
    report = json.loads(report_file.read_text())
    assert rc == 0 and report["failed_stage"] is None, report.get("error")
    load = report["stages"]["load"]
    assert load["quant"]["mode"] == "emulated" and load["quant"]["converted"] == 14
    assert all(s["sha256"] for s in load["shards"])
    align = report["stages"]["align"]
    assert align["passed"] and align["e2e"]["token_match_rate"] == 1.0
    assert all(row["cosine"] > 0.9999 for row in align["layers"])


@pytest.mark.slow
def test_a_gguf_only_directory_is_planned_in_its_own_format() -> None:
    from agents.runtime.testing.real_models import real_gguf_release

    release = real_gguf_release("smollm2-135m")
    model_dir, config = _load_job(release)
    assert model_dir == release and not (release / "config.json").exists()
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert config["quantization_config"] == {"quant_method": "gguf", "type": "q4_1",
                                             "types": {"F32": 61, "Q4_1": 210, "Q8_0": 1}}
    report = plan_report(config, memory_bytes=8 * 10**9, devices_per_node=1, dtype="auto",
                         hardware_dtypes=["bfloat16", "float32"])
    assert report["dtype"] == "q4_1" and report["quant"]["mode"] == "emulated"
    # q4_1 blocks (20 bytes per 32 weights) for the linears; the planner counts the embeddings (28 M of SmolLM2's
    # 135 M) in 16 bits where this file keeps them Q8_0, so it plans 1.25 × the file's size
    size = next(release.glob("*.gguf")).stat().st_size
    assert 1.0 * size < report["weight_bytes"] < 1.3 * size
