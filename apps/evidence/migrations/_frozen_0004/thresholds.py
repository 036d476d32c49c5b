"""The threshold table as migration 0004 judged with it (DEFAULTS_VERSION 2026.12.1), frozen: the contract's
``thresholds`` moves on, what 0004 did does not. Only what its verdicts read: the defaults, ``merged`` and
``looser_keys``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# Bump when a default or a range changes: stored with every verdict so old verdicts say what they used.
DEFAULTS_VERSION = "2026.12.1"


@dataclass(frozen=True)
class Threshold:
    """One key: its default, its valid range (``low``/``high``, open or closed), which way is looser, and
    whether it must be an integer. ``context_bound``: the value may not exceed the model's context length."""

    key: str
    default: float
    low: float
    high: float
    strict: Literal["min", "max", "none"]  # min: results must reach it; max: results must stay under it
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    context_bound: bool = False
    doc: str = ""

    def describe_range(self) -> str:
        lo = "(" if self.low_open else "["
        hi = ")" if self.high_open else "]"
        high = "inf" if math.isinf(self.high) else _fmt(self.high)
        kind = "an integer in " if self.integer else ""
        return f"{kind}{lo}{_fmt(self.low)}, {high}{hi}"

    def check(self, value: float, *, context_length: int | None = None) -> None:
        """ValueError naming the key and its range when ``value`` is outside it."""
        ok = math.isfinite(value)
        ok = ok and (value > self.low if self.low_open else value >= self.low)
        ok = ok and (value < self.high if self.high_open else value <= self.high)
        ok = ok and (not self.integer or float(value).is_integer())
        if not ok:
            raise ValueError(f"threshold {self.key}: {_fmt(value)} is outside its range {self.describe_range()}")
        if self.context_bound and context_length and value > context_length:
            raise ValueError(f"threshold {self.key}: {_fmt(value)} is longer than the model's context length "
                             f"{context_length} (range {self.describe_range()}, at most the context length)")

    def looser(self, value: float) -> bool:
        """Whether ``value`` lets through more than the default does."""
        if self.strict == "min":
            return value < self.default
        if self.strict == "max":
            return value > self.default
        return False


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


INF = math.inf
TABLE: dict[str, Threshold] = {t.key: t for t in (
    # operators (align_ops), also the per-operator gate of the align verdict
    Threshold("op_cosine", 0.999, 0.0, 1.0, "min", low_open=True, doc="operator cosine similarity, at least"),
    Threshold("op_max_rel_err", 1e-2, 0.0, INF, "max", doc="operator max relative error, at most"),
    Threshold("moe_topk_agreement", 1.0, 0.0, 1.0, "min", doc="routed experts equal, of the non-near-tie tokens"),
    Threshold("near_tie_margin", 1e-3, 0.0, 1.0, "max", doc="router probability margin below which a token is a tie"),
    # layers and end to end (align_layers, align_e2e)
    Threshold("layer_cosine", 0.99, 0.0, 1.0, "min", low_open=True, doc="per-layer hidden-state cosine, at least"),
    Threshold("layer_max_rel_err", INF, 0.0, INF, "max", doc="per-layer max relative error, at most (off: inf)"),
    Threshold("e2e_top_k", 5, 1, 100, "max", integer=True, doc="a near-tie: each side's token in the other's top-k"),
    Threshold("perplexity_rel_tol", 0.05, 0.0, INF, "max", doc="|ppl_target - ppl_ref| / ppl_ref, at most"),
    # KV cache (align_kv)
    Threshold("kv_cache_max_abs_err", 1e-4, 0.0, INF, "max", doc="incremental vs full recompute, max abs error"),
    Threshold("kv_cache_max_len", 1024, 1, 10_000_000, "min", integer=True, context_bound=True,
              doc="the longest sequence the KV-cache check runs"),
    # load and plan
    Threshold("fail_on_nonfinite", 0, 0, 1, "min", integer=True, doc="1: a NaN/Inf weight fails the load"),
    Threshold("max_nodes", 16, 1, 4096, "none", integer=True, doc="nodes the planner may span"),
    # bench
    Threshold("bench_min_concurrency_levels", 3, 1, 64, "min", integer=True,
              doc="distinct concurrency levels a baseline must sweep"),
    Threshold("bench_max_failure_ratio", 0.0, 0.0, 1.0, "max", doc="failed / all requests of a run, at most"),
    # eval
    Threshold("eval_rtol", 0.05, 0.0, 1.0, "max", doc="per task: target >= reference x (1 - rtol)"),
    Threshold("eval_accuracy_tol", 0.07, 0.0, 1.0, "max", doc="|accuracy_target - accuracy_ref|, at most"),
    Threshold("eval_perplexity_rel_tol", 0.02, 0.0, INF, "max", doc="eval texts' relative perplexity difference"),
)}

DEFAULTS: dict[str, float] = {key: t.default for key, t in TABLE.items()}

# The groups stages read (kept for the stage modules that import them).
OPS: dict[str, float] = {k: DEFAULTS[k] for k in ("op_cosine", "op_max_rel_err", "moe_topk_agreement",
                                                    "near_tie_margin")}
ALIGN: dict[str, float] = {k: DEFAULTS[k] for k in ("op_cosine", "op_max_rel_err", "layer_cosine", "e2e_top_k",
                                                      "perplexity_rel_tol")}
EVAL: dict[str, float] = {k: DEFAULTS[k] for k in ("eval_accuracy_tol", "eval_perplexity_rel_tol")}
OTHER_KEYS: tuple[str, ...] = tuple(k for k in TABLE if k not in {*OPS, *ALIGN, *EVAL})


def merged(overrides: Mapping[str, Any] | None) -> dict[str, float]:
    """The defaults with a job's (already checked) overrides on top; unknown keys are ignored."""
    out = dict(DEFAULTS)
    for key, value in (overrides or {}).items():
        if key in TABLE and isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def looser_keys(overrides: Mapping[str, Any] | None) -> list[str]:
    """The overridden keys that are looser than their defaults ("custom thresholds"), sorted."""
    out = []
    for key, value in (overrides or {}).items():
        spec = TABLE.get(key)
        if spec is not None and isinstance(value, int | float) and not isinstance(value, bool) and spec.looser(value):
            out.append(key)
    return sorted(out)
