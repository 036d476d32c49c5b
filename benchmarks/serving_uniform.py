"""Uniform load on the fp32 100M Llama: 16 requests, prompt 128, output 64, all submitted at once.
The runtime (continuous batching, paged cache) against ``transformers`` generating the same 16 prompts as one
static batch, same machine and threads; prints the runtime's achieved FLOP/s beside a measured fp32 matmul rate.

    .venv/bin/python benchmarks/serving_uniform.py [--threads N] [--requests 16] [--prompt-len 128] [--output-len 64]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def run_runtime(model_dir, prompts, output_len, max_batched_tokens):
    from agents.runtime.engine import LLMEngine, SamplingParams

    engine = LLMEngine(
        model_dir,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=max_batched_tokens,
        num_blocks=len(prompts) * (-(-(len(prompts[0]) + output_len) // 16) + 1),
    )
    engine.warmup()
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    ttft = [o.first_token_time - o.arrival_time for o in outs]
    return elapsed, ttft, [o.output_token_ids for o in outs], engine.stats()["num_steps"]


def run_transformers(model_dir, prompts, output_len):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)  # all prompts have the same length: no padding
    kwargs = dict(do_sample=False, max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:, :8], **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        elapsed = time.perf_counter() - t0
    return elapsed, out[:, ids.shape[1] :].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-batched-tokens", type=int, default=1024)
    args = parser.parse_args()

    import torch
    from _serving_common import config_of, flops, matmul_rate, model_100m, print_table

    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = model_100m()
    config = config_of(model_dir)
    rng = random.Random(0)
    prompts = [[rng.randrange(16, config["vocab_size"]) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    n_out = args.requests * args.output_len
    print(
        f"model {model_dir.name}, {args.requests} requests x (prompt {args.prompt_len}, output {args.output_len}), "
        f"torch threads {torch.get_num_threads()}"
    )

    rt_s, rt_ttft, rt_tokens, steps = run_runtime(model_dir, prompts, args.output_len, args.max_batched_tokens)
    hf_s, hf_tokens = run_transformers(model_dir, prompts, args.output_len)
    chunks = [(0, args.prompt_len)] * args.requests
    chunks += [(args.prompt_len + i, 1) for i in range(args.output_len - 1) for _ in range(args.requests)]
    work = flops(config, chunks, logits_rows=n_out)
    peak = matmul_rate()
    same = sum(a == b for a, b in zip(rt_tokens, hf_tokens, strict=True))
    print_table(
        {
            "runtime": {
                "wall s": rt_s,
                "output tok/s": n_out / rt_s,
                "p50 TTFT ms": sorted(rt_ttft)[len(rt_ttft) // 2] * 1000,
                "achieved GFLOP/s": work / rt_s / 1e9,
            },
            "transformers": {
                "wall s": hf_s,
                "output tok/s": n_out / hf_s,
                "p50 TTFT ms": float("nan"),
                "achieved GFLOP/s": work / hf_s / 1e9,
            },
        },
        "uniform load",
    )
    print(
        f"\nmeasured fp32 matmul rate: {peak / 1e9:.1f} GFLOP/s; runtime reaches {work / rt_s / peak:.0%} of it "
        f"({work / 1e9:.0f} GFLOP of work, {steps} engine steps)"
    )
    print(f"runtime / transformers throughput: {hf_s / rt_s:.2f}x (target >= 1x)")
    print(f"greedy outputs identical to transformers: {same}/{args.requests} requests")


if __name__ == "__main__":
    main()
