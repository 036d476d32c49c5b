"""Serving metrics in the Prometheus text exposition format (no client library needed)."""

from __future__ import annotations

import resource
import threading
from collections.abc import Callable

from agents.runtime.engine.outputs import RequestOutput

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        lines += [f'{name}_bucket{{le="+Inf"}} {self.total}', f"{name}_sum {self.sum}", f"{name}_count {self.total}"]
        return lines


def peak_memory_bytes() -> int:
    """Peak resident memory of this process (and of the accelerator when there is one)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak = max(peak, torch.cuda.max_memory_allocated())
    except ImportError:
        pass
    return peak


class ServerMetrics:
    """Counters fed by the engine thread (``observe``) and the HTTP handlers (``count_error``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.finished: dict[str, int] = {}
        self.errors: dict[int, int] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram()
        self.tpot = Histogram()
        self.e2e = Histogram()
        # one engine step (schedule, forward, sample, detokenise): beside the client's inter-token latency it
        # says how much of that latency is the engine's and how much the HTTP side's
        self.step = Histogram((0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5))

    def observe(self, outputs: list[RequestOutput]) -> None:
        with self._lock:
            for out in outputs:
                self.generation_tokens += len(out.new_token_ids)
                if not out.finished:
                    continue
                reason = out.finish_reason or "unknown"
                self.finished[reason] = self.finished.get(reason, 0) + 1
                self.prompt_tokens += out.num_prompt_tokens
                if out.first_token_time is not None:
                    self.ttft.observe(out.first_token_time - out.arrival_time)
                    if out.num_output_tokens > 1 and out.finish_time is not None:
                        self.tpot.observe((out.finish_time - out.first_token_time) / (out.num_output_tokens - 1))
                if out.finish_time is not None:
                    self.e2e.observe(out.finish_time - out.arrival_time)

    def observe_step(self, seconds: float) -> None:
        with self._lock:
            self.step.observe(seconds)

    def count_error(self, status: int) -> None:
        with self._lock:
            self.errors[status] = self.errors.get(status, 0) + 1

    def render(self, engine_stats: Callable[[], dict[str, int]] | None) -> str:
        stats = engine_stats() if engine_stats else {}
        with self._lock:
            lines = [
                "# HELP day0_requests_total Finished requests by finish reason.",
                "# TYPE day0_requests_total counter",
            ]
            lines += [f'day0_requests_total{{finish_reason="{k}"}} {v}' for k, v in sorted(self.finished.items())]
            lines += [
                "# HELP day0_request_errors_total Refused requests by HTTP status.",
                "# TYPE day0_request_errors_total counter",
            ]
            lines += [f'day0_request_errors_total{{status="{k}"}} {v}' for k, v in sorted(self.errors.items())]
            lines += _counter("day0_prompt_tokens_total", "Prompt tokens of finished requests.", self.prompt_tokens)
            lines += _counter("day0_generation_tokens_total", "Generated tokens.", self.generation_tokens)
            lines += self.ttft.render("day0_time_to_first_token_seconds", "Time to first token.")
            lines += self.tpot.render("day0_time_per_output_token_seconds", "Time per output token after the first.")
            lines += self.e2e.render("day0_e2e_request_latency_seconds", "End-to-end request latency.")
            lines += self.step.render("day0_engine_step_seconds", "One engine step: schedule, forward, sample.")
        gauges = {
            "day0_kv_blocks_used": ("KV-cache blocks in use.", stats.get("kv_blocks_used", 0)),
            "day0_kv_blocks_free": ("KV-cache blocks free.", stats.get("kv_blocks_free", 0)),
            "day0_kv_blocks_total": ("KV-cache blocks in the pool.", stats.get("kv_blocks_total", 0)),
            "day0_kv_cache_bytes": ("Bytes of the KV-cache pool.", stats.get("kv_cache_bytes", 0)),
            "day0_num_requests_waiting": ("Requests queued (queue depth).", stats.get("num_waiting", 0)),
            "day0_num_requests_running": ("Requests being served.", stats.get("num_running", 0)),
            "day0_peak_memory_bytes": ("Peak memory of the server process.", peak_memory_bytes()),
        }
        for name, (help_text, value) in gauges.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        lines += _counter("day0_num_preemptions_total", "Sequences preempted.", stats.get("num_preemptions", 0))
        return "\n".join(lines) + "\n"


def _counter(name: str, help_text: str, value: int) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
