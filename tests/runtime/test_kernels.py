"""The fused fp32 CPU kernels' library (``agents.runtime.kernels``: build, load, fallback): it builds and loads where
a compiler is, the engine's greedy tokens and logits equal with the kernels on and off, the fallbacks (turned off,
a failing build, cases a kernel does not cover, a dispatch mode) and the cache's pruning. Every kernel test file
(``test_kernels*.py``: elementwise, attention, experts, panels) runs again for every narrower vector width the host
can build (AVX2 and SSE code on an AVX-512 host)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agents.runtime import kernels
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.kernels import build, library
from agents.runtime.testing.make_model import cached_model

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"kernels not built: {kernels.status()}")


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_the_library_builds_and_loads_where_a_compiler_is():
    status = kernels.status()
    assert status["loaded"] and status["reason"] is None and status["vector_width"] in (4, 8, 16)


def _cpu_flags() -> set[str]:
    try:
        return {f for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
                for f in line.split(":", 1)[1].split()}
    except OSError:
        return set()


KERNEL_TEST_FILES = sorted(str(p) for p in Path(__file__).parent.glob("test_kernels*.py"))
NARROWER = {  # compiler flags -> the width they build, where the host has a wider one
    8: "-mno-avx512f",
    4: "-mno-avx512f -mno-avx2 -mno-fma -mno-avx",
}


@pytest.mark.slow
@needs_kernels
@pytest.mark.skipif(os.environ.get("DAY0_KERNEL_CFLAGS") is not None, reason="already a narrower build")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 widths")
@pytest.mark.parametrize("width", [4, 8])  # SSE / NEON-sized: rarer hosts
def test_every_kernel_at_a_narrower_vector_width(width, tmp_path):
    """A hypervisor or an older core can hide AVX-512 (or AVX2): the same source built for that width passes
    every kernel test file. Built into its own cache here, from the host's flags minus the wider units."""
    have = kernels.status()["vector_width"]
    if width >= have or (width == 8 and "avx2" not in _cpu_flags()):
        pytest.skip(f"the host's own build is {have} lanes")
    env = {**os.environ, "DAY0_KERNEL_CFLAGS": NARROWER[width], "DAY0_KERNEL_CACHE": str(tmp_path / "cache")}
    probe = subprocess.run([sys.executable, "-c", "from agents.runtime import kernels; print(kernels.status())"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert f"'vector_width': {width}" in probe.stdout, probe.stdout + probe.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *KERNEL_TEST_FILES],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


def test_cases_the_kernels_do_not_cover_fall_back():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert kernels.rms_norm(x, torch.ones(64, dtype=torch.bfloat16), 1e-6) is None
    assert kernels.silu_and_mul(torch.randn(4, 64).t()) is None  # not contiguous
    assert kernels.rms_norm(torch.randn(2, 3, 4, 8), torch.ones(8), 1e-6) is None  # 4 dims
    q = torch.randn(2, 4, 1024)  # head_dim beyond the kernel's buffers
    cache = torch.randn(4, 16, 4, 1024)
    lens, tables = torch.tensor([3, 5], dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32)
    assert kernels.paged_decode_attention(q, cache, cache, tables, lens, 0.1, None) is None
    assert kernels.paged_decode_attention(q[..., :64], cache[..., :64].contiguous(), cache[..., :64].contiguous(),
                                          tables.long(), lens, 0.1, None) is None  # int64 tables


PROMPTS = [[5, 9, 11], list(range(20, 77)), [7] * 40, [3]]
PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@needs_kernels
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3-moe", "mixtral"])
def test_engine_greedy_tokens_equal_with_and_without_kernels(arch, monkeypatch):
    path = cached_model(arch)
    fused = [o.output_token_ids for o in LLMEngine(path, num_blocks=64, block_size=4).generate(PROMPTS, PARAMS)]
    monkeypatch.setattr(library, "state", "unavailable")
    plain = [o.output_token_ids for o in LLMEngine(path, num_blocks=64, block_size=4).generate(PROMPTS, PARAMS)]
    assert fused == plain


@needs_kernels
def test_engine_logits_close_with_and_without_kernels(monkeypatch):
    """Beyond the argmax: the decode logits of a mixed batch agree to fp32 rounding."""
    path = cached_model("llama")
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=5)

    def logprobs() -> list[float]:
        engine = LLMEngine(path, num_blocks=64, block_size=4)
        ids = [engine.add_request(p, params) for p in PROMPTS]
        got: dict[str, list[float]] = {i: [] for i in ids}
        while engine.has_unfinished():
            for out in engine.step():
                got[out.request_id] += [v for lp in out.new_logprobs or [] for v in (lp.logprob, *dict(lp.top).values())]
        return [v for i in ids for v in got[i]]

    fused = logprobs()
    assert len(fused) == len(PROMPTS) * 6 * 6  # each token: its logprob and the top 5
    monkeypatch.setattr(library, "state", "unavailable")
    torch.testing.assert_close(torch.tensor(fused), torch.tensor(logprobs()), rtol=1e-4, atol=1e-4)


def _reset(monkeypatch):
    monkeypatch.setattr(library, "state", "unloaded")
    monkeypatch.setattr(library, "lib", None)
    monkeypatch.setattr(library, "reason", "")


def test_turned_off_by_the_environment(monkeypatch):
    _reset(monkeypatch)
    monkeypatch.setenv("DAY0_NATIVE_KERNELS", "0")
    assert not kernels.available()
    assert kernels.status() == {"loaded": False, "reason": "turned off by DAY0_NATIVE_KERNELS", "vector_width": None}
    assert kernels.silu_and_mul(torch.randn(2, 8)) is None


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_a_failing_build_is_said_once_and_the_torch_code_runs(monkeypatch, tmp_path, caplog):
    _reset(monkeypatch)
    broken = tmp_path / "broken.c"
    broken.write_text("int day0_abi_version(void) { return 1 }\n")  # a syntax error
    monkeypatch.setattr(build, "SOURCE", broken)
    monkeypatch.setenv("DAY0_KERNEL_CACHE", str(tmp_path / "cache"))
    assert not kernels.available()
    reason = kernels.status()["reason"]
    assert "failed" in reason and "broken.c" in reason
    assert "native CPU kernels unavailable" in caplog.text
    engine = LLMEngine(cached_model("llama"), num_blocks=32)
    assert len(engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0))[0].output_token_ids) == 3
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-written left behind


@needs_kernels
def test_a_dispatch_mode_sees_the_models_own_aten_ops():
    """The operator inventory traces with a dispatch mode: under one, the kernels step aside."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 64)
    assert kernels.silu_and_mul(x) is not None  # no mode: the kernel
    with Record():
        assert kernels.silu_and_mul(x) is None
        engine = LLMEngine(cached_model("llama"), num_blocks=32, block_size=4)
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0))
    assert {"aten.silu.default", "aten.rsqrt.default", "aten.argmax.default"} <= seen


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_a_new_build_prunes_libraries_unused_for_a_month(monkeypatch, tmp_path):
    _reset(monkeypatch)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("DAY0_KERNEL_CACHE", str(cache))
    stale, recent, other = (cache / "day0_cpu_kernels-stale.so", cache / "day0_cpu_kernels-recent.so",
                            cache / "notes.txt")
    for path in (stale, recent, other):
        path.write_bytes(b"x")
    month_ago = time.time() - (build.PRUNE_DAYS + 1) * 86400
    os.utime(stale, (month_ago, month_ago))
    os.utime(other, (month_ago, month_ago))
    assert kernels.available()
    left = sorted(p.name for p in cache.iterdir())
    assert "day0_cpu_kernels-stale.so" not in left and {"day0_cpu_kernels-recent.so", "notes.txt"} <= set(left)
    assert len([n for n in left if n.endswith(".so")]) == 2  # the new library and the recent one
