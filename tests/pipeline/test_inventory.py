from __future__ import annotations

import pytest
import torch

from agents.pipeline.stages.inventory import stage as inventory
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.runtime.models.llama import LlamaForCausalLM
from agents.runtime.models.registry import register
from contract.sections import section_problems

UNTRACEABLE = "UntraceableLlamaForCausalLM"


@register(UNTRACEABLE)
class UntraceableLlama(LlamaForCausalLM):
    """A native family whose forward calls something this torch cannot run."""

    def forward(self, *args, **kwargs):
        raise NotImplementedError("aten::fancy_fused_attention has no kernel for CPU")

TINY_MOE = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 512, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 512,
    "hidden_act": "silu",
}
LLAMA_70B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 8192,
    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "rope_theta": 500000.0,
}


NORM_OPS = ("aten.rms_norm.default", "aten._fused_rms_norm.default", "aten.rsqrt.default")


def norm_calls(section: dict) -> int:
    """RMSNorm applications, whichever way the runtime computes them (fused in fp32, written out otherwise)."""
    counts = {op["op"]: op["count"] for op in section["ops"]}
    return max(counts.get(name, 0) for name in NORM_OPS)


def _run(config: dict, events: list, **hardware) -> dict:
    def emit(kind, message, *, level="info", data=None, stage=""):
        events.append((kind, data))

    ctx = StageContext(model_dir=None, config=config, hardware={"slug": "cpu", **hardware}, emit_fn=emit)
    ctx.current_stage = "inventory"
    return inventory.run(ctx)


@pytest.fixture(scope="module")
def tiny_section() -> tuple[dict, list]:
    events: list = []
    return _run(TINY_MOE, events), events


def test_tiny_moe_checklist_counts_prefill_and_decode(tiny_section):
    section, _ = tiny_section
    assert section_problems("inventory", section) == []
    assert section["trace_device"] == "cpu" and section["dispatch_key"] == "CPU"
    ops = {op["op"]: op for op in section["ops"]}
    assert norm_calls(section) == 2 * (2 * 2 + 1)  # 2 norms per layer + the final one, in 2 steps
    assert ops["aten.embedding.default"]["count"] == 2
    assert ops["aten.topk.default"]["phases"] == ["prefill", "decode"]
    assert "float32" in ops["aten.mul.Tensor"]["dtypes"]
    assert sum(section["summary"].values()) == len(section["ops"])
    assert section["summary"]["missing"] == 0  # everything runs on this CPU build of torch


def test_decomposed_ops_name_native_targets(tiny_section):
    section, _ = tiny_section
    by_name = {op["op"]: op for op in section["ops"]}
    linear = by_name["aten.linear.default"]
    assert linear["status"] == "decomposed" and "aten.mm.default" in linear["decomposes_to"]
    assert linear["served_by"] == "CompositeImplicitAutograd"
    recorder, _ = inventory.capture(TINY_MOE, dtype="float32", device="cpu")
    classifier = inventory.Classifier("CPU", run_device="cpu")
    for func, record in recorder.ops.items():  # classifies every leaf on the sample it was called with
        classifier.classify(func, record.sample)
    for op in section["ops"]:
        if op["status"] == "decomposed":
            for name in op["decomposes_to"]:
                namespace, packet, overload = name.split(".")
                target = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
                assert classifier.classify(target, None)["status"] == "native", (op["op"], name)


def test_cpu_kernels_and_composites_are_told_apart(tiny_section):
    """What serves each operator on the CPU key of this torch, per op."""
    section, _ = tiny_section
    ops = {op["op"]: op for op in section["ops"]}

    def row(name: str) -> tuple:
        return ops[name]["status"], ops[name]["served_by"], ops[name]["decomposes_to"]

    assert row("aten.topk.default") == ("native", "CPU", [])  # RegisterCPU: a CPU kernel
    # the math kernel picks the CPU flash kernel for this causal prefill
    assert row("aten.scaled_dot_product_attention.default") == (
        "decomposed", "CompositeImplicitAutograd", ["aten._scaled_dot_product_flash_attention_for_cpu.default"])
    # the generic copy_ kernel calls no other operator: it ran the CPU copy stub on the CPU
    assert row("aten.copy_.default") == ("native", "CompositeExplicitAutograd", [])
    assert "per-device stub" in ops["aten.copy_.default"]["kernel"]
    assert row("aten.zeros.default") == (
        "decomposed", "CompositeExplicitAutograd", ["aten.empty.memory_format", "aten.zero_.default"])
    arange = [name for name in ops if name.startswith("aten.arange.")]
    assert arange and all(row(name)[:2] == ("decomposed", "CompositeExplicitAutograd") for name in arange)
    assert all("aten.arange.start_out" in row(name)[2] for name in arange)
    assert row("aten.transpose.int")[0] == "native" and ops["aten.transpose.int"]["kernel"] == "view"
    assert section["summary"]["fallback"] == 0


def test_an_untraceable_native_model_fails_the_stage_naming_the_error():
    config = {**TINY_MOE, "model_type": "llama", "architectures": [UNTRACEABLE]}
    config.pop("num_local_experts"), config.pop("num_experts_per_tok")
    with pytest.raises(StageFailed, match=r"runtime's native model cannot be traced: NotImplementedError: "
                                          r"aten::fancy_fused_attention has no kernel for CPU"):
        _run(config, [])


def test_a_model_on_the_fallback_path_is_labelled_fallback():
    config = {**TINY_MOE, "model_type": "llama", "architectures": ["SomeNewArchForCausalLM"]}
    config.pop("num_local_experts"), config.pop("num_experts_per_tok")
    section = _run(config, [])
    assert section["path"] == "fallback" and section["model_source"] == "runtime-fallback"
    assert {op["status"] for op in section["ops"]} == {"fallback"}
    silu = next(op for op in section["ops"] if op["op"] == "aten.silu.default")
    assert silu["kernel_status"] == "native" and silu["served_by"] == "CPU"  # the kernel, on a generic path


def test_the_loaded_model_is_traced_when_the_load_stage_left_one(make_ctx):
    from agents.pipeline.runner import run_pipeline

    ctx, _ = make_ctx("llama")
    report = run_pipeline(ctx, "load,inventory")
    assert report["failed_stage"] is None, report["error"]
    section = report["stages"]["inventory"]
    assert section["weights"] == "loaded" and section["summary"]["missing"] == 0


def test_progress_events_count_operators(tiny_section):
    section, events = tiny_section
    progress = [data for kind, data in events if kind == "progress"]
    assert progress[0]["done"] == 0 and progress[-1]["done"] == progress[-1]["total"] == len(section["ops"])


def test_manifest_makes_an_operator_native_on_an_out_of_tree_backend():
    recorder, _ = inventory.capture(TINY_MOE, dtype="float32", device="cpu")
    bare = inventory.classify_ops(recorder, "PrivateUse1")
    with_manifest = inventory.classify_ops(recorder, "PrivateUse1", manifest=["aten::mm", "aten.topk"])
    status = {op["op"]: op["status"] for op in bare["ops"]}
    status_m = {op["op"]: op["status"] for op in with_manifest["ops"]}
    assert status["aten.topk.default"] == "missing"  # this torch has no PrivateUse1 kernels
    assert status_m["aten.topk.default"] == "native"
    assert status_m["aten.linear.default"] == "decomposed"  # linear -> mm (manifest) + t (a view)
    assert with_manifest["summary"]["missing"] < bare["summary"]["missing"]


def test_huge_config_runs_on_meta_without_weights():
    events: list = []
    section = _run(LLAMA_70B, events)
    assert section["trace_device"] == "meta"
    assert section["weight_bytes"] > 100e9
    assert norm_calls(section) == 2 * (2 * 80 + 1)  # 80 layers x 2 norms + the final norm, 2 steps


def test_config_without_vocab_is_named():
    with pytest.raises(StageFailed, match="vocab_size"):
        _run({"model_type": "llama"}, [])


def test_a_fallback_model_whose_wrapper_cannot_trace_is_traced_through_transformers_and_says_so(monkeypatch):
    from agents.runtime.models.fallback import FallbackModel

    def broken(self, *args, **kwargs):
        raise RuntimeError("wrapper bug")

    monkeypatch.setattr(FallbackModel, "forward", broken)
    config = {**TINY_MOE, "model_type": "llama", "architectures": ["SomeNewArchForCausalLM"]}
    config.pop("num_local_experts"), config.pop("num_experts_per_tok")
    section = _run(config, [])
    assert section["model_source"] == "transformers" and section["runtime_trace_error"] == "RuntimeError: wrapper bug"
    assert section["ops"] and {op["status"] for op in section["ops"]} == {"fallback"}
