"""Serving benchmark client and its metrics."""

from agents.runtime.bench.client import run_benchmark, run_benchmark_async
from agents.runtime.bench.metrics import format_table

__all__ = ["format_table", "run_benchmark", "run_benchmark_async"]
