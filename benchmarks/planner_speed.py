"""Planner speed: `plan_report` on every bundled config (the 3-trillion-parameter MoE included) and the whole
`day0 estimate` command as a subprocess, with the peer side by side — counting the same parameters by
building the `transformers` model on the meta device (what the planner avoids).

    .venv/bin/python benchmarks/planner_speed.py [--repeat 20] [--hardware nvidia-h100-sxm] [--no-peer]

Targets: a dense config well under 10 ms; `day0 estimate` on the 3T config under 1 s end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contract.hardware import DATA_DIR, get_hardware  # noqa: E402
from contract.planner import plan_report  # noqa: E402


def median_ms(fn, repeat: int) -> float:
    fn()  # warm caches (json, imports)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def peer_seconds(config: dict) -> tuple[float, int]:
    """transformers: build the model on the meta device and sum its parameters."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map", "_comment", "model_type")}
    model_type = "deepseek_v3" if cfg["architectures"][0] == "DeepseekV3ForCausalLM" else config["model_type"]
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg))
    total = sum(p.numel() for p in model.parameters())
    return time.perf_counter() - t0, total


def cli_seconds(slug: str, hardware: str) -> float:
    cmd = [sys.executable, "-m", "day0cli", "estimate", slug, "--hardware", hardware, "--dtype", "fp8",
           "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"day0 estimate failed: {done.stderr}")
    json.loads(done.stdout)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--hardware", default="nvidia-h100-sxm")
    parser.add_argument("--no-peer", action="store_true", help="skip the transformers meta-device peer")
    args = parser.parse_args()
    hw = get_hardware(args.hardware)
    print(f"hardware {hw.slug}: {hw.memory_bytes / 2**30:.1f} GiB x {hw.devices_per_node} per node; "
          f"repeat {args.repeat}, median")
    print(f"{'config':<20} {'params':>10} {'plan ms':>9} {'plan':>18} {'transformers meta s':>20} {'same count':>10}")
    for path in sorted((DATA_DIR / "configs").glob("*.json")):
        config = json.loads(path.read_text())

        def run(config: dict = config) -> dict:
            return plan_report(config, memory_bytes=hw.memory_bytes, devices_per_node=hw.devices_per_node)

        ms = median_ms(run, args.repeat)
        report = run()
        p = report["plan"]
        shape = f"tp{p['tp']} pp{p['pp']} ep{p['ep']} = {p['devices']}" if p else "none"
        peer, same = "-", "-"
        if not args.no_peer:
            seconds, total = peer_seconds(config)
            peer, same = f"{seconds:.3f}", "yes" if total <= report["params_total"] <= total + 10**6 else "NO"
        print(f"{path.stem:<20} {report['params_total'] / 1e9:>9.1f}B {ms:>9.2f} {shape:>18} {peer:>20} {same:>10}")
    wall = min(cli_seconds("synthetic-3t-moe", args.hardware) for _ in range(3))
    print(f"\nday0 estimate synthetic-3t-moe (subprocess, best of 3): {wall:.3f} s (target < 1 s)")


if __name__ == "__main__":
    main()
