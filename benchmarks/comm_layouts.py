"""Parallel layouts on this machine: per (tp, ep, pp) layout of a tiny MoE model, the decode TPOT, the
communication overhead ratio on every rank, the collectives' bus bandwidth (all_reduce, nccl-tests' busbw) beside
this machine's measured memory bandwidth, and the plan's memory per device beside each rank's measured bytes
(parameters + KV pool) and peak RSS.

    .venv/bin/python benchmarks/comm_layouts.py [--model qwen3-moe] [--tokens 32] [--max-bytes 16777216]

On this host the ranks are gloo processes sharing its cores and memory: the numbers show what each layout costs
in communication relative to compute here, not what a fabric delivers."""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

import torch

from agents.pipeline.support.collective_rank import CommSettings
from agents.pipeline.support.collectives import measure
from agents.runtime.distributed import COMM_TIMER, ParallelState, get_parallel_state, launch
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.testing.make_model import cached_model

# (tp, ep, pp) and the world size (pp x max(tp, ep) as the planner counts, or more: EP independent of TP)
LAYOUTS: list[tuple[tuple[int, int, int], int]] = [
    ((1, 1, 1), 1), ((2, 1, 1), 2), ((1, 2, 1), 2), ((1, 1, 2), 2), ((2, 2, 1), 2), ((2, 1, 2), 4), ((2, 2, 1), 4),
]
PROMPTS = 4


def decode_rank(model_dir: str, layout: tuple[int, int, int], tokens: int) -> dict[str, Any]:
    """One rank: the layout, an engine on this rank's stage (every rank runs the same greedy steps), a timed
    decode of ``PROMPTS`` sequences, and this rank's comm/step totals, bytes and peak RSS."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    assert get_parallel_state() == ParallelState.of(rank, dist.get_world_size() if dist.is_initialized() else 1,
                                                    *layout)
    torch.set_num_threads(1)
    engine = LLMEngine(model_dir, num_blocks=64, block_size=16)
    prompts = [[5 + i, 17, 33 + i, 40, 2 + i] for i in range(PROMPTS)]
    greedy = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    engine.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))  # warm-up
    COMM_TIMER.enable()
    t0 = time.perf_counter()
    engine.generate(prompts, greedy)
    seconds = time.perf_counter() - t0
    totals = COMM_TIMER.snapshot()
    COMM_TIMER.enable(False)
    params = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    return {"rank": rank, "state": get_parallel_state(), "tpot_ms": seconds / tokens * 1000, "comm": totals,
            "param_bytes": params, "kv_bytes": engine.runner.kv_cache_bytes,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def memory_bandwidth_gbps(mib: int = 256, repeats: int = 5) -> float:
    """This host's copy bandwidth (read + write bytes over the best time), one thread as the ranks run."""
    src = torch.ones(mib << 18)  # float32: mib MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def plan_bytes(config: dict, layout: tuple[int, int, int]) -> tuple[int | None, int | None]:
    """(bytes per device, weight bytes per device) the planner gives this layout pinned, on this host."""
    from contract.hardware import cpu_hardware
    from contract.planner import plan_report

    hw = cpu_hardware()
    tp, ep, pp = layout
    report = plan_report(config, memory_bytes=hw.memory_bytes, devices_per_node=1, shared_memory=True,
                         dtype="float32", tp=tp, pp=pp, ep=ep)
    return report.get("bytes_per_device"), report.get("breakdown", {}).get("weights")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-moe", help="a tiny test model family (cached_model name)")
    parser.add_argument("--tokens", type=int, default=32, help="decode tokens per sequence")
    parser.add_argument("--max-bytes", type=int, default=16 << 20, help="largest all_reduce message of the sweep")
    args = parser.parse_args()
    import json

    model_dir = cached_model(args.model)
    config = json.loads((model_dir / "config.json").read_text())
    membw = memory_bandwidth_gbps()
    print(f"model {args.model} (tiny, fp32), {PROMPTS} sequences x {args.tokens} tokens; "
          f"host copy bandwidth {membw:.1f} GB/s (one thread)")
    head = (f"{'tp':>3}{'ep':>3}{'pp':>3}{'ranks':>6}{'TPOT ms':>9}{'comm/step':>11}{'(min-max)':>14}"
            f"{'busbw GB/s':>11}{'of membw':>9}{'plan MiB/dev':>13}{'plan wts':>9}{'held MiB':>9}{'peak RSS':>9}")
    print(head)
    print("-" * len(head))
    for layout, world in LAYOUTS:
        tp, ep, pp = layout
        ranks = [decode_rank(str(model_dir), layout, args.tokens)] if world == 1 else launch(
            decode_rank, world, str(model_dir), layout, args.tokens, tp_size=tp, ep_size=ep, pp_size=pp, timeout=900)
        ratios = [r["comm"]["comm_overhead_ratio"] or 0.0 for r in ranks]
        busbw = None
        if world > 1:
            settings = CommSettings(ops=("all_reduce",), dtypes=("float32",), min_bytes=1 << 16,
                                    max_bytes=args.max_bytes, factor=4, iters=10, warmup=2)
            rows = measure(world, settings)["collectives"][0]["sizes"]
            busbw = max(s["busbw_gbps"] for s in rows)
        per_device, weights = plan_bytes(config, layout)
        held = max(r["param_bytes"] + r["kv_bytes"] for r in ranks)
        peak = max(r["peak_rss_bytes"] for r in ranks)
        mib = 1 << 20
        bus = f"{busbw:>11.2f}{busbw / membw:>9.1%}" if busbw else f"{'-':>11}{'-':>9}"
        plan = f"{per_device / mib:>13.1f}{weights / mib:>9.1f}" if per_device else f"{'-':>13}{'-':>9}"
        print(f"{tp:>3}{ep:>3}{pp:>3}{world:>6}{ranks[0]['tpot_ms']:>9.2f}{sum(ratios) / len(ratios):>11.1%}"
              f"{f'{min(ratios):.0%}-{max(ratios):.0%}':>14}{bus}{plan}{held / mib:>9.1f}{peak / mib:>9.0f}")
    print("comm/step: time in collectives over step time, mean over ranks (each rank timed with device sync);")
    print("plan MiB/dev: the planner's bytes per device (weights, activations, buffers, overhead, minimum KV);")
    print("held MiB: the busiest rank's parameters + KV pool; peak RSS: the busiest rank's process (torch included)")


if __name__ == "__main__":
    main()
