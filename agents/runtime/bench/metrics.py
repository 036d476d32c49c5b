"""Per-request timings and their summary, with vLLM serving-benchmark definitions: TTFT is the time to the first
streamed token, TPOT = (e2e − TTFT) / (output tokens − 1), ITL is the gap between streamed chunks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestResult:
    ok: bool = False
    ttft: float = 0.0  # seconds
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


P99_MIN_SAMPLES = 100  # fewer samples than this: the p99 reported is the maximum (an interpolated p99 is a guess)


def stats_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    arr = np.asarray(values, dtype=np.float64) * 1000.0
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    if arr.size < P99_MIN_SAMPLES:
        p99 = arr.max()
    return {
        "mean": round(float(arr.mean()), 3),
        "p50": round(float(p50), 3),
        "p90": round(float(p90), 3),
        "p99": round(float(p99), 3),
    }


def jitter(stats: dict[str, float | None]) -> float | None:
    """p99 / p50 of a latency summary (1.0: every step as fast as the median); None without data."""
    p50, p99 = stats.get("p50"), stats.get("p99")
    return round(p99 / p50, 4) if p50 and p99 is not None else None


def summarize(results: list[RequestResult], duration: float, **extra: object) -> dict:
    """One ``runs`` entry of the bench section."""
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    tpots = [r.tpot for r in done if r.tpot is not None]
    tpot = stats_ms(tpots)
    samples = {"ttft_ms": len(done), "tpot_ms": len(tpots), "itl_ms": sum(len(r.itl) for r in done),
               "e2e_ms": len(done)}
    return {
        **extra,
        "prompts": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": round(duration, 3),
        # the requests (ITL: the gaps) behind each metric's percentiles; a p99 of fewer is the maximum
        "samples": samples,
        "p99_is_max": sorted(m for m, n in samples.items() if 0 < n < P99_MIN_SAMPLES),
        "ttft_ms": stats_ms([r.ttft for r in done]),
        "tpot_ms": tpot,
        "tpot_jitter": jitter(tpot),
        "itl_ms": stats_ms([gap for r in done for gap in r.itl]),
        "e2e_ms": stats_ms([r.e2e for r in done]),
        "input_tokens": sum(r.prompt_tokens for r in done),
        "output_tokens": output_tokens,
        "output_tok_s": round(output_tokens / duration, 3) if duration > 0 else 0.0,
        "req_s": round(len(done) / duration, 3) if duration > 0 else 0.0,
        "errors": sorted({r.error for r in results if r.error})[:5],
    }


def format_table(section: dict) -> str:
    """The runs of a bench section as a fixed-width table."""
    head = f"{'case':<10}{'conc':>5}{'ok':>5}{'fail':>5}{'out tok/s':>11}{'req/s':>8}"
    for name in ("ttft", "tpot", "itl", "e2e"):
        head += f"{name + ' p50':>11}{name + ' p99':>11}"
    lines = [head, "-" * len(head)]
    runs = [("sweep", r) for r in section.get("runs", [])]
    if section.get("long_context"):
        runs.append(("long", section["long_context"]))
    for case, run in runs:
        line = f"{case:<10}{run['concurrency']:>5}{run['completed']:>5}{run['failed']:>5}"
        line += f"{run['output_tok_s']:>11.1f}{run['req_s']:>8.2f}"
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            for q in ("p50", "p99"):
                value = run[name][q]
                line += f"{'-' if value is None else f'{value:.1f}':>11}"
        lines.append(line)
    lines.append("(latencies in ms)")
    for case, run in runs:
        extras = []
        if run.get("tpot_jitter") is not None:
            extras.append(f"TPOT p99/p50 {run['tpot_jitter']:.2f}")
        if run.get("comm_overhead_ratio") is not None:
            extras.append(f"comm overhead {run['comm_overhead_ratio']:.1%}")
        if run.get("expert_balance"):
            extras.append(f"expert max/mean {run['expert_balance']['max_over_mean']:.2f}")
        if extras:
            lines.append(f"{case} c={run['concurrency']}: " + ", ".join(extras))
    probe = section.get("probe")
    if probe:
        lines.append(f"repeated-prompt probe c={probe['concurrency']}: {probe['repeated']['output_tok_s']:.1f} tok/s "
                     f"repeated, {probe['fresh']['output_tok_s']:.1f} fresh")
    if section.get("expert_load"):
        load = section["expert_load"]
        lines.append(
            f"expert load: max/mean {load['max_over_mean']:.2f} (worst layer "
            f"{load['worst_layer_max_over_mean']:.2f}), cv {load['cv']:.2f} over {load['layers']} layers"
        )
    if section.get("peak_memory_bytes"):
        lines.append(f"server peak memory: {section['peak_memory_bytes'] / 2**20:.0f} MiB")
    return "\n".join(lines)
