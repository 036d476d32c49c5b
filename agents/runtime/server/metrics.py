"""The server's Prometheus metrics, named and labelled as vLLM's (``vllm:*`` with ``model_name``) so dashboards and
alerts written for vLLM read ``day0 serve`` unchanged, and the runtime's own under ``day0:*``.

Each server owns a ``CollectorRegistry`` (tests run several servers in one process). Request metrics are fed by
the engine thread (``observe``, once per step); the engine's state (queue, KV cache, preemptions) and the
runtime's own figures are read at scrape time by ``EngineCollector``. Only rank 0 of a multi-rank server runs the
scheduler and answers HTTP, so request metrics exist there alone; what other ranks know (their time in
collectives) rank 0 already gathers through the rendezvous store (``engine.tp.RankStats``), which the collector
reads, labelled by rank: no multiprocess directory, and no collective on the serving path.

Prefix caching (``--enable-prefix-caching``): ``vllm:prefix_cache_queries_total`` (prompt tokens looked up) and
``vllm:prefix_cache_hits_total`` (those found cached) as vLLM names them; both stay 0 with caching off."""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agents.runtime.engine.outputs import RequestOutput

disable_created_metrics()  # no ``*_created`` series: vLLM serves none, and they double every counter
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's bucket bounds for the request latencies, so quantiles from both servers compare bucket for bucket
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                         10.0, 20.0, 40.0, 80.0)
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


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
    """Counters fed by the engine thread (``observe``, ``observe_step``) and the HTTP handlers (``count_error``);
    ``bind`` names the model and gives the collector the engine to read at scrape time."""

    def __init__(self, model_name: str = "") -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._last_token: dict[str, float] = {}  # request id -> when its latest token came out
        reg, m = self.registry, ["model_name"]
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               [*m, "finished_reason"], registry=reg)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", m, registry=reg)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens processed.", m, registry=reg)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", m,
                              buckets=TTFT_BUCKETS, registry=reg)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request.", m,
                             buckets=TOKEN_LATENCY_BUCKETS, registry=reg)
        # the name vLLM's earlier dashboards query for the same per-token interval
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time per output token (each token).", m,
                              buckets=TOKEN_LATENCY_BUCKETS, registry=reg)
        self.request_tpot = Histogram("vllm:request_time_per_output_token_seconds",
                                      "Mean time per output token of each request.", m,
                                      buckets=TOKEN_LATENCY_BUCKETS, registry=reg)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", m,
                             buckets=LATENCY_BUCKETS, registry=reg)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Time a request waited before it was scheduled.",
                               m, buckets=LATENCY_BUCKETS, registry=reg)
        self.prefill = Histogram("vllm:request_prefill_time_seconds", "From scheduled to the first token.", m,
                                 buckets=LATENCY_BUCKETS, registry=reg)
        self.decode = Histogram("vllm:request_decode_time_seconds", "From the first token to the last.", m,
                                buckets=LATENCY_BUCKETS, registry=reg)
        self.inference = Histogram("vllm:request_inference_time_seconds", "From scheduled to finished.", m,
                                   buckets=LATENCY_BUCKETS, registry=reg)
        self.request_prompt = Histogram("vllm:request_prompt_tokens", "Prompt tokens of each finished request.", m,
                                        buckets=TOKEN_COUNT_BUCKETS, registry=reg)
        self.request_generation = Histogram("vllm:request_generation_tokens",
                                            "Generated tokens of each finished request.", m,
                                            buckets=TOKEN_COUNT_BUCKETS, registry=reg)
        self.iteration_tokens = Histogram("vllm:iteration_tokens_total", "Tokens generated per engine step.", m,
                                          buckets=TOKEN_COUNT_BUCKETS, registry=reg)
        self.errors = Counter("day0:request_errors", "Refused or failed HTTP requests by status.",
                              [*m, "status"], registry=reg)
        # one engine step (schedule, forward, sample, detokenise): beside the client's inter-token latency it
        # says how much of that latency is the engine's and how much the HTTP side's
        self.step = Histogram("day0:engine_step_seconds", "One engine step: schedule, forward, sample.", m,
                              buckets=STEP_BUCKETS, registry=reg)
        self.engine_collector = EngineCollector(self)
        reg.register(self.engine_collector)
        ProcessCollector(registry=reg)  # process_resident_memory_bytes, CPU seconds, open fds

    def bind(self, model_name: str, engine: Callable[[], Any]) -> None:
        """``engine``: the ready engine, or None while it loads."""
        self.model_name = model_name
        self.engine_collector.engine = engine

    def observe(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        name = self.model_name
        generated = 0
        with self._lock:
            for out in outputs:
                n = len(out.new_token_ids)
                generated += n
                if n:
                    last = self._last_token.get(out.request_id)
                    if last is not None:  # one interval per token this step produced
                        for _ in range(n):
                            self.itl.labels(name).observe((now - last) / n)
                            self.tpot.labels(name).observe((now - last) / n)
                    self._last_token[out.request_id] = now
                if out.finished:
                    self._last_token.pop(out.request_id, None)
                    self._finished(out, name)
            if generated:
                self.generation_tokens.labels(name).inc(generated)
                self.iteration_tokens.labels(name).observe(generated)

    def _finished(self, out: RequestOutput, name: str) -> None:
        self.success.labels(name, out.finish_reason or "unknown").inc()
        self.prompt_tokens.labels(name).inc(out.num_prompt_tokens)
        self.request_prompt.labels(name).observe(out.num_prompt_tokens)
        self.request_generation.labels(name).observe(out.num_output_tokens)
        scheduled, first, end = out.first_scheduled_time, out.first_token_time, out.finish_time
        if scheduled is not None:
            self.queue.labels(name).observe(scheduled - out.arrival_time)
        if first is not None:
            self.ttft.labels(name).observe(first - out.arrival_time)
            if scheduled is not None:
                self.prefill.labels(name).observe(first - scheduled)
            if end is not None:
                self.decode.labels(name).observe(end - first)
                if out.num_output_tokens > 1:
                    self.request_tpot.labels(name).observe((end - first) / (out.num_output_tokens - 1))
        if end is not None:
            self.e2e.labels(name).observe(end - out.arrival_time)
            if scheduled is not None:
                self.inference.labels(name).observe(end - scheduled)

    def observe_step(self, seconds: float) -> None:
        self.step.labels(self.model_name).observe(seconds)

    def count_error(self, status: int) -> None:
        self.errors.labels(self.model_name, str(status)).inc()

    def render(self, engine_stats: Callable[[], dict[str, int]] | None = None) -> str:
        """The exposition text (``engine_stats`` overrides the bound engine's ``stats``, for callers without one)."""
        self.engine_collector.stats = engine_stats
        return generate_latest(self.registry).decode()


class EngineCollector(Collector):
    """Gauges and counters read from the engine when scraped: vLLM's scheduler and KV-cache figures and the
    runtime's own (native-decode coverage, expert balance, time in collectives)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.engine: Callable[[], Any] = lambda: None
        self.stats: Callable[[], dict[str, int]] | None = None

    def describe(self) -> list:
        return []  # read at scrape time only: the registry must not call ``collect`` when it registers this

    def collect(self) -> Iterator[Any]:
        name = self.metrics.model_name
        engine = self.engine()
        stats = self.stats() if self.stats else (engine.stats() if engine is not None else {})

        def gauge(metric: str, doc: str, value: float, extra: dict[str, str] | None = None) -> GaugeMetricFamily:
            family = GaugeMetricFamily(metric, doc, labels=["model_name", *(extra or {})])
            family.add_metric([name, *(extra or {}).values()], value)
            return family

        total = stats.get("kv_blocks_total", 0)
        used = stats.get("kv_blocks_used", 0)
        yield gauge("vllm:num_requests_running", "Requests in the running batch.", stats.get("num_running", 0))
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", stats.get("num_waiting", 0))
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 is every block in use.", used / total if total else 0)
        preempted = CounterMetricFamily("vllm:num_preemptions", "Preemptions by the scheduler.", labels=["model_name"])
        preempted.add_metric([name], stats.get("num_preemptions", 0))
        # constrained decoding (response_format, forced tool calls): the time spent computing grammar token
        # masks, and their rows
        masks = CounterMetricFamily("day0:grammar_mask_seconds", "Seconds computing and applying grammar token "
                                    "masks (response_format, forced tool calls).", labels=["model_name"])
        masks.add_metric([name], stats.get("grammar_mask_seconds", 0.0))
        yield masks
        rows = CounterMetricFamily("day0:grammar_mask_rows", "Sequence-steps given a grammar token mask.",
                                   labels=["model_name"])
        rows.add_metric([name], stats.get("grammar_mask_rows", 0))
        yield rows
        yield preempted
        queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of "
                                      "queried tokens.", labels=["model_name"])
        queries.add_metric([name], stats.get("prefix_cache_queries", 0))
        yield queries
        hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached "
                                   "tokens.", labels=["model_name"])
        hits.add_metric([name], stats.get("prefix_cache_hits", 0))
        yield hits
        yield gauge("day0:kv_blocks_used", "KV-cache blocks in use.", used)
        yield gauge("day0:kv_blocks_free", "KV-cache blocks free.", stats.get("kv_blocks_free", 0))
        yield gauge("day0:kv_blocks_capacity", "KV-cache blocks in the pool.", total)
        yield gauge("day0:kv_cache_bytes", "Bytes of the KV-cache pool.", stats.get("kv_cache_bytes", 0))
        yield gauge("day0:peak_memory_bytes", "Peak memory of the server process.", peak_memory_bytes())
        if engine is not None:
            yield from _runtime_figures(engine, name)


def _runtime_figures(engine: Any, name: str) -> Iterator[Any]:
    """Native-decode coverage, expert balance and the ranks' time in collectives."""
    model = getattr(engine, "model", None)
    decode_steps = getattr(model, "decode_steps", None)
    if isinstance(decode_steps, int):
        for metric, doc, value in (
            ("day0:decode_steps", "Decode forwards of this stage's layers.", decode_steps),
            ("day0:native_decode_steps", "Decode forwards the native decode plan ran.", model.native_decode_steps),
        ):
            family = CounterMetricFamily(metric, doc, labels=["model_name"])
            family.add_metric([name], value)
            yield family
        coverage = GaugeMetricFamily("day0:native_decode_coverage_ratio",
                                     "Share of decode forwards run by the native decode plan.", labels=["model_name"])
        coverage.add_metric([name], model.native_decode_steps / decode_steps if decode_steps else 0.0)
        yield coverage
    load = getattr(engine, "expert_load", None)
    if load is not None and load.active:
        rows = [r for r in load.counts() if sum(r)]
        if rows:
            ratios = [max(r) / (sum(r) / len(r)) for r in rows]
            balance = GaugeMetricFamily("day0:expert_load_max_over_mean",
                                        "Busiest expert's tokens over the mean (1 is perfect balance).",
                                        labels=["model_name", "layers"])
            balance.add_metric([name, "mean"], sum(ratios) / len(ratios))
            balance.add_metric([name, "worst"], max(ratios))
            yield balance
    yield from _comm_figures(name)


def _comm_figures(name: str) -> Iterator[Any]:
    """Time in collectives over time in steps, per rank: only while the timer runs (``POST /stats/comm``), and
    asked of the other ranks then alone (an idle scrape sends nothing through the store)."""
    from agents.runtime.distributed import COMM_TIMER

    if not COMM_TIMER.enabled:
        return
    try:
        snap = COMM_TIMER.snapshot()
    except RuntimeError:  # a rank did not answer in time: rank 0's own figure still stands
        snap = COMM_TIMER.local_snapshot()
    ranks = snap.get("ranks") or [{"rank": 0, **snap}]
    ratio = GaugeMetricFamily("day0:comm_overhead_ratio", "Time in collectives over time in engine steps.",
                              labels=["model_name", "rank"])
    for row in ranks:
        if row.get("comm_overhead_ratio") is not None:
            ratio.add_metric([name, str(row["rank"])], row["comm_overhead_ratio"])
    yield ratio
