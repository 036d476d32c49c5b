"""Shared pieces of the serving benchmarks: the 100M Llama, FLOP accounting, the matmul roofline and the
percentile table. Not a benchmark itself."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch


def model_100m() -> Path:
    """The fp32 100M Llama built by ``make_model("llama", "100m")`` (cached)."""
    from agents.runtime.testing.make_model import cached_model

    return cached_model("llama", "100m")


def config_of(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def flops(config: dict, new_tokens: list[tuple[int, int]], logits_rows: int) -> float:
    """Forward FLOPs for chunks ``(start, n)`` (n new tokens after ``start`` cached): 2 × linear params per token,
    attention QK and PV over each token's context, and the LM head for ``logits_rows`` rows."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // heads
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    per_token_linear = layers * (h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * inter)
    total = 0.0
    for start, n in new_tokens:
        total += 2.0 * per_token_linear * n
        ctx_sum = n * start + n * (n + 1) / 2  # sum of context lengths of the n new tokens
        total += 4.0 * layers * heads * hd * ctx_sum
    return total + 2.0 * h * vocab * logits_rows


def matmul_rate(size: int = 1024, seconds: float = 2.0) -> float:
    """Measured fp32 matmul FLOP/s on this machine with the current torch thread count."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, b)
        n += 1
    return 2.0 * size**3 * n / (time.perf_counter() - t0)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q)) if values else float("nan")


def print_table(rows: dict[str, dict[str, float]], title: str) -> None:
    names = list(rows)
    keys = list(rows[names[0]])
    print(f"\n{title}")
    print(f"{'metric':<28}" + "".join(f"{n:>18}" for n in names))
    for key in keys:
        print(f"{key:<28}" + "".join(f"{rows[n][key]:>18.2f}" for n in names))
