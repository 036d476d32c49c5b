"""Load speed and memory: the runtime's strict streaming loader against `transformers` from_pretrained on the
same 100M-parameter checkpoint, each in a fresh process, files already in the page cache.

    .venv/bin/python benchmarks/runtime_load.py [--arch llama] [--size 100m] [--repeats 3]

Targets (issue 3): >= 5 GB/s and peak RSS <= 1.1 x model bytes (the RSS the process had before loading is
subtracted: interpreter and torch). The runtime also checksums every shard and gathers per-tensor statistics;
rows with those switched off, or with the shard digests taken from the checksum cache (valid while a file's
size, inode, mtime and ctime are unchanged), show what they cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]

RUNTIME = """
import json, sys
from agents.runtime.loader import load_model
r = load_model(sys.argv[1], stats=sys.argv[2] == "1").report
print(json.dumps({k: r[k] for k in ("bytes", "seconds", "peak_rss_bytes", "rss_before_bytes")}))
"""

TRANSFORMERS = """
import json, sys, time
from agents.runtime.loader.stats import current_rss, peak_rss, reset_peak_rss
import torch, transformers
from transformers import AutoModelForCausalLM
transformers.utils.logging.disable_progress_bar()
reset_peak_rss(); before = current_rss()
t = time.perf_counter()
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
seconds = time.perf_counter() - t
nbytes = sum(p.numel() * p.element_size() for p in m.state_dict().values())
print(json.dumps({"bytes": nbytes, "seconds": seconds, "peak_rss_bytes": peak_rss(), "rss_before_bytes": before}))
"""


def warm_page_cache(path: Path) -> int:
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb", buffering=0) as fh:
            while chunk := fh.read(16 << 20):
                total += len(chunk)
    return total


def run(code: str, *args: str, cache: str = "off") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DAY0_CHECKSUM_CACHE": cache}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, check=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(code: str, repeats: int, *args: str, cache: str = "off") -> dict:
    return min((run(code, *args, cache=cache) for _ in range(repeats)), key=lambda r: r["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--size", default="100m")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from agents.runtime.testing.make_model import cached_model

    path = cached_model(args.arch, args.size)
    file_bytes = warm_page_cache(path)
    print(f"model: {path.name}, {file_bytes / 1e6:.1f} MB of safetensors (page cache warmed)")
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "sha256.json")
        run(RUNTIME, str(path), "0", cache=cache)  # fills the checksum cache
        rows = [
            ("runtime sha256 + stats", best(RUNTIME, args.repeats, str(path), "1")),
            ("runtime sha256 only", best(RUNTIME, args.repeats, str(path), "0")),
            ("runtime cached sha256 + stats", best(RUNTIME, args.repeats, str(path), "1", cache=cache)),
            ("runtime cached sha256 only", best(RUNTIME, args.repeats, str(path), "0", cache=cache)),
        ]
    rows += [
        ("transformers from_pretrained", best(TRANSFORMERS, args.repeats, str(path))),
    ]
    print(f"\n{'loader':<30}{'seconds':>9}{'GB/s':>8}{'peak RSS MB':>13}{'RSS before':>12}{'added/model':>13}")
    for name, r in rows:
        added = (r["peak_rss_bytes"] - r["rss_before_bytes"]) / r["bytes"]
        print(f"{name:<30}{r['seconds']:>9.3f}{r['bytes'] / r['seconds'] / 1e9:>8.2f}"
              f"{r['peak_rss_bytes'] / 1e6:>13.1f}{r['rss_before_bytes'] / 1e6:>12.1f}{added:>12.2f}x")
    print("\ntargets: runtime >= 5 GB/s, added RSS <= 1.10x model bytes")


if __name__ == "__main__":
    main()
