"""The workloads of ``serving_vllm.py`` and the ``vllm bench serve`` arguments that drive each, by model and phase.
Not a benchmark itself.

A phase is one start of both servers with the same settings: ``base`` (``--max-model-len 2048``, prefix caching
off on both: the original table), ``long`` (``--max-model-len 4096``: 2,048-token prompts and their outputs fit)
and ``prefix`` (``--max-model-len 4096`` and ``--enable-prefix-caching`` on both servers: vLLM's
``prefix_repetition`` dataset, requests that share a few long prefixes and differ in their suffixes)."""

from __future__ import annotations

from dataclasses import dataclass

MIXED = {"input_len": 272, "output_len": 136, "range_ratio": 0.88235}  # 32-512 in (BOS included), 16-256 out
# phase -> (--max-model-len, prefix caching on both servers)
PHASES = {"base": (2048, False), "long": (4096, False), "prefix": (4096, True)}
MODELS = ("dense", "moe", "smollm2")  # Llama-100M (random), Qwen3-MoE-100M (random), SmolLM2-135M (real weights)


@dataclass(frozen=True)
class Workload:
    name: str
    label: str
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int | None = None  # None: no limit
    rate: float | None = None  # requests/s (Poisson); None: all at once; "capacity" rows set it later
    range_ratio: float = 0.0
    from_capacity: bool = False  # rate = 0.9 x the slower side's measured capacity
    expected_s: float = 0.0  # per side, on a quiet machine (figures measured when it was written): the up-front time estimate
    phase: str = "base"
    prefix_len: int = 0  # prefix phase: tokens of each shared prefix (input_len is then the suffix's)
    num_prefixes: int = 0
    show_ttft: bool = False  # TTFT in the table (always for batch 1 and Poisson arrivals)


def _new_rows(quick: bool) -> list[Workload]:
    """2,048-token prompts, and a shared-prefix load with prefix caching on both servers."""
    if quick:
        return [Workload("long2k", "2,048-token prompts, 2 at once, 8 out", 2048, 8, 2, 2, phase="long",
                         show_ttft=True, expected_s=10),
                Workload("prefix", "shared prefixes (2 x 512 + 64 in), 4 at once, 16 out", 64, 16, 8, 4,
                         phase="prefix", prefix_len=512, num_prefixes=2, show_ttft=True, expected_s=8)]
    return [Workload("long2k", "2,048-token prompts, 4 at once, 64 out", 2048, 64, 8, 4, phase="long",
                     show_ttft=True, expected_s=40),
            Workload("prefix", "shared prefixes (4 x 1,024 + 128 in), 8 at once, 64 out", 128, 64, 32, 8,
                     phase="prefix", prefix_len=1024, num_prefixes=4, show_ttft=True, expected_s=30)]


def workloads(quick: bool, model: str = "dense") -> list[Workload]:
    """dense: the original five and the two new ones; moe: batch 1 and 16 at once; smollm2: batch 1, 16 at once
    and the two new ones."""
    if quick:
        rows = [Workload("batch1", "batch 1: 32 in, 16 out", 32, 16, 2, 1, expected_s=3),
                Workload("conc16", "4 at once: 32 in, 16 out", 32, 16, 8, 4, expected_s=3),
                Workload("capacity", "capacity (8 at once, 6 done)", 64, 32, 8, 8, range_ratio=0.5, expected_s=5),
                Workload("poisson_cap", "Poisson 0.9 x capacity, 8 requests", 64, 32, 8, range_ratio=0.5,
                         from_capacity=True, expected_s=8),
                Workload("poisson_2", "Poisson 2.0/s, 8 requests", 64, 32, 8, rate=2.0, range_ratio=0.5,
                         expected_s=6)]
    else:
        rows = [Workload("batch1", "batch 1: 128 in, 128 out", 128, 128, 8, 1, expected_s=19),
                Workload("conc16", "16 at once: 128 in, 64 out", 128, 64, 32, 16, expected_s=8),
                Workload("capacity", "capacity (24 at once, 18 done)", num_prompts=24, concurrency=24,
                         expected_s=19, **MIXED),
                Workload("poisson_cap", "Poisson 0.9 x capacity, 64 requests", num_prompts=64, from_capacity=True,
                         expected_s=60, **MIXED),
                Workload("poisson_2", "Poisson 2.0/s, 64 requests", num_prompts=64, rate=2.0, expected_s=45,
                         **MIXED)]
    if model == "moe":
        return rows[:2]
    if model == "smollm2":
        return rows[:2] + _new_rows(quick)
    return rows + _new_rows(quick)


def all_names() -> set[str]:
    return {w.name for w in workloads(False, "dense")}


def bench_argv(w: Workload, url: str, served_name: str, model_dir: str, seed: int, rate: float | None) -> list[str]:
    """``vllm bench serve`` arguments for one run of ``w`` against the server at ``url``."""
    argv = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model_dir, "--served-model-name", served_name, "--tokenizer", model_dir]
    if w.phase == "prefix":
        argv += ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(w.prefix_len),
                 "--prefix-repetition-suffix-len", str(w.input_len), "--prefix-repetition-num-prefixes",
                 str(w.num_prefixes), "--prefix-repetition-output-len", str(w.output_len)]
    else:
        argv += ["--dataset-name", "random", "--random-input-len", str(w.input_len),
                 "--random-output-len", str(w.output_len), "--random-range-ratio", f"{w.range_ratio:g}"]
    argv += ["--num-prompts", str(w.num_prompts), "--ignore-eos", "--temperature", "0", "--seed", str(seed),
             "--request-rate", "inf" if rate is None else f"{rate:.4f}", "--disable-tqdm", "--save-detailed",
             "--percentile-metrics", "ttft,tpot,itl,e2el"]
    if w.concurrency:
        argv += ["--max-concurrency", str(w.concurrency)]
    return argv
