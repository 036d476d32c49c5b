"""The compiled path (``engine/compiled/``): compiled greedy tokens equal eager ones; a second process with the
same cache directory takes its graphs from Inductor's FX graph cache; no graph breaks, no recompile in service;
clear errors where it cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.engine.compiled import CompiledModel, CompileUnavailable, check_cpp_compiler
from agents.runtime.testing.make_model import cached_model

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["Hello world, this is a test of", "The quick brown fox", "a " * 40]

# One process: eager tokens, then the same engine compiled (warm-up compiles), then the same prompts again.
PROCESS = """
import json, sys
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.testing.make_model import cached_model
prompts = json.loads(sys.argv[2])
params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
eager = LLMEngine(cached_model(sys.argv[1]), num_blocks=48, max_num_batched_tokens=32)
want = [o.output_token_ids for o in eager.generate(prompts, params)]
engine = LLMEngine(cached_model(sys.argv[1]), num_blocks=48, max_num_batched_tokens=32, compile=True)
engine.warmup()
got = [o.output_token_ids for o in engine.generate(prompts, params)]
print("RESULT " + json.dumps({"eager": want, "compiled": got, "stats": engine.compiled.stats.report()}))
"""


def _run_process(arch: str, cache: Path) -> dict:
    env = {**os.environ, "DAY0_COMPILE_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", PROCESS, arch, json.dumps(PROMPTS)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _first_compile(cache) -> dict:
    """A fresh process compiling into an empty cache: its tokens equal eager's, one region, no breaks."""
    first = _run_process("llama", cache)
    assert first["compiled"] == first["eager"]
    stats = first["stats"]
    assert stats["graph_breaks"] == 0, stats["graph_break_reasons"]
    assert stats["graphs"] == 2  # one region shared by every layer: a step of several tokens, a step of one
    assert stats["recompiles_after_warmup"] == 0, stats["recompile_reasons"]
    assert stats["cache"]["fxgraph_miss"] >= 1 and stats["cache"]["fxgraph_hit"] == 0
    assert stats["compile_seconds"] > 0 and stats["cache_dir"] == str(cache.resolve())
    return first


@pytest.mark.slow
def test_a_fresh_process_compiles_one_region_and_its_tokens_equal_eager(tmp_path):
    _first_compile(tmp_path / "compile-cache")


@pytest.mark.slow  # two compiling processes (~45 s); the first alone is the test above
def test_second_process_hits_the_fx_graph_cache_and_compiled_tokens_equal_eager(tmp_path):
    cache = tmp_path / "compile-cache"
    first = _first_compile(cache)
    stats = first["stats"]
    second = _run_process("llama", cache)
    assert second["compiled"] == second["eager"] == first["eager"]
    cached = second["stats"]["cache"]
    assert cached["fxgraph_hit"] >= 1 and cached["fxgraph_miss"] == 0, cached
    assert second["stats"]["compile_seconds"] < stats["compile_seconds"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral", "qwen3", "deepseek-v3"])
def test_compiled_tokens_equal_eager_on_moe_qk_norm_and_mla_families(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_COMPILE_CACHE_DIR", str(tmp_path))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    engine = LLMEngine(cached_model(arch), num_blocks=48, max_num_batched_tokens=32)
    eager = [o.output_token_ids for o in engine.generate(PROMPTS, params)]
    counts_eager = engine.expert_load.counts()
    compiled = CompiledModel(engine.model)
    assert engine.model.native_decode is False  # every step runs the compiled region while it is installed
    try:
        engine.warmup()
        compiled.mark_warm()
        assert [o.output_token_ids for o in engine.generate(PROMPTS, params)] == eager
        stats = compiled.stats.report()
        assert stats["graph_breaks"] == 0 and stats["recompiles_after_warmup"] == 0, stats
        if engine.expert_load.active:  # the expert-load hooks still count, inside the opaque experts op
            counts = engine.expert_load.counts()
            assert sum(map(sum, counts)) > sum(map(sum, counts_eager))
    finally:
        compiled.remove()
    assert engine.model.native_decode is True
    assert [o.output_token_ids for o in engine.generate(PROMPTS, params)] == eager  # eager again once removed


def test_no_cpp_compiler_is_a_clear_error():
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/g++")}), pytest.raises(
            CompileUnavailable, match="needs a C\\+\\+ compiler.*apt-get install g\\+\\+"):
        check_cpp_compiler()


def test_cpp_compiler_is_found_here():
    assert "g++" in check_cpp_compiler() or "c++" in check_cpp_compiler()


def test_the_fallback_path_is_refused_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("DAY0_COMPILE_CACHE_DIR", str(tmp_path))
    from torch import nn

    with pytest.raises(CompileUnavailable, match="native families"):
        CompiledModel(nn.Linear(2, 2))


def test_linears_large_enough_for_the_eager_onednn_call_compile_inside_the_region(tmp_path, monkeypatch):
    """The eager path calls oneDNN directly for large fp32 weights; Inductor lowers that op only on frozen
    weights, so inside the region the linears must leave the GEMM to Inductor."""
    import torch

    from agents.runtime.engine.compiled import configure_caches, inductor_gemms
    from agents.runtime.layers import linear

    configure_caches(tmp_path)
    w = torch.randn(linear.ONEDNN_MIN_WEIGHT // 256, 256)  # [out, in]: exactly the eager path's oneDNN size
    x = torch.randn(linear.GEMM_MIN_ROWS * 2, 256)
    fn = torch.compile(linear.dense_linear, dynamic=True)
    with inductor_gemms():
        out = fn(x, w)
    torch.testing.assert_close(out, x @ w.T, rtol=1e-4, atol=1e-4)
    assert linear._ONEDNN == (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                                               "_linear_pointwise"))
