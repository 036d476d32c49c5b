"""Mixed load on the fp32 100M Llama, the case serving exists for: 64 requests, prompt 32–512 and output
16–256 tokens drawn from a fixed seed, arriving as a Poisson process near saturation.

* runtime: requests join the running engine at their arrival times (continuous batching, chunked prefill);
* transformers: the same requests in arrival order as static batches of up to 8, each left-padded to its
  longest prompt: a batch starts as soon as the previous one has ended and work is waiting (every request
  arrived by then, up to 8; when none is waiting, the next arrival starts one), and is held until its longest
  request ends.

The arrival rate is 0.9 x the slower side's capacity (each side's requests finished per second, 24 of the same
length distribution submitted at once, until three quarters are done), unless ``--rate`` is given. Prints p50/p99
TTFT, TPOT and output throughput for both (targets: >= 2x throughput, >= 5x lower p50 TTFT).

    .venv/bin/python benchmarks/serving_mixed.py [--threads N] [--rate R] [--requests 64] [--seed 0]
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


def workload(n: int, vocab: int, seed: int, rate: float) -> list[dict]:
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        prompt_len, output_len = rng.randint(32, 512), rng.randint(16, 256)
        reqs.append(
            {
                "id": i,
                "arrival": t,
                "prompt": [rng.randrange(16, vocab) for _ in range(prompt_len)],
                "output_len": output_len,
            }
        )
        t += rng.expovariate(rate)
    return reqs


def summarize(name: str, ttft: list[float], tpot: list[float], tokens: int, span: float) -> dict[str, float]:
    from _serving_common import pct

    return {
        "p50 TTFT ms": pct(ttft, 50),
        "p99 TTFT ms": pct(ttft, 99),
        "p50 TPOT ms": pct(tpot, 50),
        "p99 TPOT ms": pct(tpot, 99),
        "output tok/s": tokens / span,
        "makespan s": span,
    }


def run_runtime(model_dir, reqs, max_batched_tokens: int) -> dict[str, float]:
    from agents.runtime.engine import LLMEngine, SamplingParams

    engine = LLMEngine(model_dir, max_num_seqs=64, max_num_batched_tokens=max_batched_tokens, max_model_len=1024)
    engine.warmup()
    pending = sorted(reqs, key=lambda r: r["arrival"])
    done: dict[str, object] = {}
    arrival_of: dict[str, float] = {}
    start = time.perf_counter()
    while len(done) < len(reqs):
        now = time.perf_counter() - start
        while pending and pending[0]["arrival"] <= now:
            r = pending.pop(0)
            rid = engine.add_request(
                r["prompt"],
                SamplingParams(max_tokens=r["output_len"], temperature=0.0, ignore_eos=True),
                request_id=str(r["id"]),
            )
            arrival_of[rid] = start + r["arrival"]
        if not engine.has_unfinished():
            time.sleep(max(0.0, pending[0]["arrival"] - now))
            continue
        for out in engine.step():
            if out.finished:
                done[out.request_id] = (out.first_token_time, out.finish_time, out.num_output_tokens)
    # engine timestamps are time.monotonic(); convert arrivals onto that clock
    shift = time.monotonic() - time.perf_counter()
    ttft, tpot, tokens, last = [], [], 0, 0.0
    for rid, (first, finish, n) in done.items():
        arrival = arrival_of[rid] + shift
        ttft.append(first - arrival)
        tpot.append((finish - first) / max(1, n - 1))
        tokens += n
        last = max(last, finish)
    return summarize("runtime", ttft, tpot, tokens, last - (start + shift))


def load_transformers(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        model.generate(torch.tensor([[16] * 8]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    return model


def run_transformers(model, reqs, batch_size: int) -> tuple[dict[str, float], list[float]]:
    """The static batcher: (summary, finish time of every request from the start)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class FirstToken(LogitsProcessor):
        def __init__(self) -> None:
            self.at: float | None = None

        def __call__(self, input_ids, scores):
            if self.at is None:
                self.at = time.perf_counter()
            return scores

    pending = sorted(reqs, key=lambda r: r["arrival"])
    ttft, tpot, finished, tokens = [], [], [], 0
    start = time.perf_counter()
    free_at = start
    i = 0
    while i < len(pending):
        # idle: wait for the next arrival; busy until now: take every request that has arrived, up to a batch
        time.sleep(max(0.0, start + pending[i]["arrival"] - time.perf_counter()))
        now = time.perf_counter() - start
        j = i + 1
        while j < len(pending) and j - i < batch_size and pending[j]["arrival"] <= now:
            j += 1
        batch, i = pending[i:j], j
        width = max(len(r["prompt"]) for r in batch)
        ids = torch.tensor([[0] * (width - len(r["prompt"])) + r["prompt"] for r in batch])  # left padding
        mask = torch.tensor([[0] * (width - len(r["prompt"])) + [1] * len(r["prompt"]) for r in batch])
        new = max(r["output_len"] for r in batch)
        first = FirstToken()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=0,
                logits_processor=LogitsProcessorList([first]),
            )
        free_at = time.perf_counter()
        for r in batch:
            arrival = start + r["arrival"]
            ttft.append(first.at - arrival)
            tpot.append((free_at - first.at) / max(1, r["output_len"] - 1))  # held until the batch ends
            finished.append(free_at - start)
            tokens += r["output_len"]
    return summarize("transformers", ttft, tpot, tokens, free_at - start), finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument(
        "--rate", type=float, default=None, help="arrivals per second (default: 0.9 x the slower side's capacity)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8, help="transformers static batch size")
    parser.add_argument("--max-batched-tokens", type=int, default=512)
    parser.add_argument("--calibration-requests", type=int, default=24, help="requests of each side's capacity run")
    args = parser.parse_args()

    import torch
    from _serving_common import config_of, model_100m, print_table

    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = model_100m()
    vocab = config_of(model_dir)["vocab_size"]
    hf_model = load_transformers(model_dir)
    if not 4 <= args.calibration_requests <= 256 or not 1 <= args.requests <= 1024:
        parser.error("--calibration-requests must be in [4, 256] and --requests in [1, 1024]")
    rate = args.rate or calibrate_rate(model_dir, hf_model, vocab, args.seed, args.batch_size, args.max_batched_tokens,
                                       args.calibration_requests)
    reqs = workload(args.requests, vocab, args.seed, rate)
    print(
        f"model {model_dir.name}: {args.requests} requests, Poisson rate {rate:.2f}/s, "
        f"{sum(len(r['prompt']) for r in reqs)} prompt and {sum(r['output_len'] for r in reqs)} output tokens, "
        f"torch threads {torch.get_num_threads()}"
    )
    rt = run_runtime(model_dir, reqs, args.max_batched_tokens)
    hf, _ = run_transformers(hf_model, reqs, args.batch_size)
    print_table({"runtime": rt, "transformers": hf}, "mixed load")
    print(
        f"\nthroughput: {rt['output tok/s'] / hf['output tok/s']:.2f}x transformers (target >= 2x); "
        f"p50 TTFT {hf['p50 TTFT ms'] / rt['p50 TTFT ms']:.1f}x lower (target >= 5x)"
    )


def calibrate_rate(model_dir, hf_model, vocab: int, seed: int, batch_size: int, max_batched_tokens: int,
                   n: int = 24) -> float:
    """0.9 × the request rate the slower side sustains at full load: ``n`` requests of the same length
    distribution submitted at once to each; capacity = requests finished per second until three quarters are
    done (the last few, running nearly alone, would understate what a loaded server sustains)."""
    from agents.runtime.engine import LLMEngine, SamplingParams

    engine = LLMEngine(model_dir, max_num_seqs=64, max_num_batched_tokens=max_batched_tokens, max_model_len=1024)
    engine.warmup()
    sample = [{**r, "arrival": 0.0} for r in workload(n, vocab, seed + 1, rate=1.0)]
    params = [SamplingParams(max_tokens=r["output_len"], temperature=0.0, ignore_eos=True) for r in sample]
    k = (3 * n + 3) // 4
    t0 = time.monotonic()
    outs = engine.generate([r["prompt"] for r in sample], params)
    runtime_t = sorted(o.finish_time for o in outs)[k - 1] - t0
    del engine
    _, finished = run_transformers(hf_model, sample, batch_size)
    hf_t = sorted(finished)[k - 1]
    caps = {"runtime": k / runtime_t, "transformers": k / hf_t}
    slower = min(caps, key=caps.get)
    print(f"calibration: {k} of {n} simultaneous requests done in {runtime_t:.1f} s (runtime), {hf_t:.1f} s "
          f"(transformers) -> capacity {caps['runtime']:.2f} and {caps['transformers']:.2f} req/s; "
          f"rate 0.9 x {slower}'s")
    return 0.9 * caps[slower]


if __name__ == "__main__":
    main()
