"""`day0 adapt` on every tiny test model: seconds per stage, with `transformers` doing the same work side by
side (from_pretrained for load; the reference forward passes inside align are transformers' share).

    .venv/bin/python benchmarks/adapt_tiny.py [--arch llama,...] [--stages plan,load,align] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="llama,qwen3,mixtral,qwen3-moe,deepseek-v3")
    parser.add_argument("--size", default="tiny", choices=("tiny", "100m"))
    parser.add_argument("--stages", default="plan,load,align")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from agents.pipeline.runner import run_pipeline
    from agents.pipeline.support.context import StageContext
    from agents.runtime.testing.make_model import cached_model
    from contract.hardware import get_hardware

    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    stages = args.stages.split(",")
    print(f"torch threads {torch.get_num_threads()}, size {args.size}, stages {args.stages}")
    header = f"{'model':<12} {'path':<9} {'tier':>4} " + " ".join(f"{s + ' s':>9}" for s in stages)
    header += f" {'hf load s':>9} {'total s':>8}  result"
    AutoModelForCausalLM.from_pretrained(cached_model("llama"), dtype=torch.float32)  # warm imports and caches
    print(header)
    print("-" * len(header))
    for arch in args.arch.split(","):
        path = cached_model(arch, args.size)
        config = json.loads((path / "config.json").read_text())
        t0 = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # the peer's load of the same files
        hf_load = time.perf_counter() - t0
        ctx = StageContext(model_dir=path, config=config, hardware=get_hardware("cpu").to_dict(),
                           emit_fn=lambda *a, **k: None)
        t0 = time.perf_counter()
        report = run_pipeline(ctx, stages)
        total = time.perf_counter() - t0
        cells = " ".join(f"{report['seconds'].get(s, float('nan')):>9.2f}" for s in stages)
        result = f"failed at {report['failed_stage']}: {report['error']}" if report["failed_stage"] else "ok"
        print(f"{arch:<12} {report['model']['path'] or '?':<9} {report['tier']:>4} {cells} {hf_load:>9.2f} "
              f"{total:>8.2f}  {result}")


if __name__ == "__main__":
    main()
