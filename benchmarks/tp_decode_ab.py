"""Decode steps at ``--tp N`` on one host, in process: the torch TP path (the layers' own forwards, a Python
all-reduce per row-parallel projection) against the native TP run (``native_decode.DecodePlan``: one native call
per run of layers, the all-reduce of the O and down projections inside it), alternating round by round on the same
ranks, weights and caches, so a busy host's drift hits both alike.

    .venv/bin/python benchmarks/tp_decode_ab.py [--model llama --size 100m] [--tp 2] [--threads 2]
                                                [--batches 1,16] [--context 128] [--steps 24] [--rounds 7]

A step is what a decode step of the server costs on the model side: the forward of B sequences at ``--context``
cached tokens each (their cache slots reused every step), the logits gathered over the ranks and their argmax.
Each rank runs ``--threads / --tp`` compute threads. Prints, per batch size, the median decode tok/s of each path
over the rounds, their spread (min-max) and the native / torch ratio; both paths' first-step logits are compared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from agents.runtime.distributed import launch  # noqa: E402


def rank_main(model_dir: str, threads: int, batches: list[int], context: int, steps: int, rounds: int) -> dict:
    from agents.runtime.loader import load_model
    from agents.runtime.models.simple_decode import PagedCache, prefill_context

    torch.set_num_threads(threads)
    model = load_model(model_dir, pack_weights=True).model  # packed as the server packs it
    out: dict = {"plan": None, "batches": {}}
    with torch.inference_mode():
        for batch in batches:  # sequence b in its own blocks, its token at position ``context``
            cache = PagedCache(model, context + 1, batch)
            ctx, positions = prefill_context(cache, list(range(batch)), [context] * batch, [1] * batch)
            ids = torch.randint(0, model.config["vocab_size"], (batch,), generator=torch.Generator().manual_seed(0))

            def step(native: bool, ctx=ctx, ids=ids, positions=positions) -> torch.Tensor:
                model.native_decode = native
                logits = model.compute_logits(model.forward(ids, positions, ctx).hidden)
                return logits.argmax(dim=-1), logits

            first = {native: step(native)[1] for native in (False, True)}  # warm both; the same cache state
            plan = model.decode_plan()
            out["plan"] = model.decode_plan_reason if plan is None else f"{len(plan.runs)} native call(s) a step"
            rates: dict[bool, list[float]] = {False: [], True: []}
            for r in range(rounds):
                for native in ((False, True) if r % 2 == 0 else (True, False)):
                    native_before = model.native_decode_steps
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        step(native)
                    rates[native].append(batch * steps / (time.perf_counter() - t0))
                    assert (model.native_decode_steps > native_before) == (native and plan is not None)
            out["batches"][batch] = {"torch": rates[False], "native": rates[True],
                                     "max_abs_diff": (first[True] - first[False]).abs().max().item()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama")
    ap.add_argument("--size", default="100m")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="cores over all ranks")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=24, help="decode steps per path per round")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    from agents.runtime.testing.make_model import cached_model

    model_dir = str(cached_model(args.model, args.size))
    batches = [int(b) for b in args.batches.split(",")]
    threads = max(1, args.threads // args.tp)
    result = launch(rank_main, args.tp, model_dir, threads, batches, args.context, args.steps, args.rounds,
                    timeout=3600)[0]
    print(f"{args.model}-{args.size} --tp {args.tp}, {threads} thread(s) a rank, context {args.context}, "
          f"{args.steps} steps x {args.rounds} rounds a path; native plan: {result['plan']}")
    print(f"{'batch':>5} {'torch tok/s':>18} {'native tok/s':>18} {'ratio':>6} {'logits max|diff|':>17}")
    for batch, r in result["batches"].items():
        t, n = statistics.median(r["torch"]), statistics.median(r["native"])
        print(f"{batch:>5} {t:>8.1f} ({min(r['torch']):.0f}-{max(r['torch']):.0f}) "
              f"{n:>8.1f} ({min(r['native']):.0f}-{max(r['native']):.0f}) {n / t:>6.2f} {r['max_abs_diff']:>17.2e}")


if __name__ == "__main__":
    main()
