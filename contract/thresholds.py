"""Every threshold a job may override: one versioned table of defaults and valid ranges, importable without
torch or Django. The portal checks a job's overrides against it when the job is submitted (a value outside
its range is a 400 naming the key and the range), ``day0 adapt --threshold`` does too, and the verdicts of
``contract.verdicts`` read the defaults from here and store ``DEFAULTS_VERSION`` with each verdict.

Each key says which way is *looser*: for a ``min`` key (a cosine the result must reach) a lower value lets
more through; for a ``max`` key (an error the result must stay under) a higher value does. A job whose
overrides are looser than the defaults is marked "custom thresholds", and so is every tier it reaches."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# Bump when a default or a range changes: stored with every verdict so old verdicts say what they used.
DEFAULTS_VERSION = "2026.12.7"  # .7: a bench on owned hardware without a memory bandwidth is incomplete


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
    Threshold("align_min_token_match", 0.9, 0.0, 1.0, "min",
              doc="end-to-end greedy tokens equal to the reference's, at least (the lower of claimed and recomputed)"),
    Threshold("align_min_ops", 4, 1, 10_000, "min", integer=True,
              doc="operator checks a native model's align section must have run, at least"),
    # KV cache (align_kv)
    Threshold("kv_cache_max_abs_err", 1e-4, 0.0, INF, "max",
              doc="incremental vs full recompute, max abs error (the gate only when no relative error is reported)"),
    # real weights: logits of magnitude ~30 drift ~1e-4 absolute at 3.6e-6 relative (SmolLM2-135M fp32)
    Threshold("kv_cache_max_rel_err", 1e-5, 0.0, INF, "max",
              doc="incremental vs full recompute, max abs error over the reference's max |logit|"),
    Threshold("kv_cache_max_len", 1024, 1, 10_000_000, "min", integer=True, context_bound=True,
              doc="the longest sequence the KV-cache check runs"),
    # an external engine's KV cache through its endpoint (align kv_self, contract/endpoint_align.py)
    Threshold("kv_self_max_mean_kl", 0.01, 0.0, INF, "max", high_open=True,
              doc="decoded vs the same text prefilled again (prefix-cache hit and miss): mean top-k KL, at most; "
                  "a perturbed prompt must exceed it (the check sees a difference)"),
    Threshold("kv_self_top_k", 5, 1, 20, "none", integer=True, doc="logprobs per position the KV self-check asks for"),
    # the image path (align_vision): vision encoder and projector outputs against transformers
    Threshold("vision_min_cosine", 0.9999, 0.0, 1.0, "min", low_open=True,
              doc="vision encoder / projector output cosine, at least"),
    Threshold("vision_max_rel_err", 1e-3, 0.0, INF, "max", doc="vision encoder / projector max relative error"),
    # load and plan
    Threshold("fail_on_nonfinite", 0, 0, 1, "min", integer=True, doc="1: a NaN/Inf weight fails the load"),
    Threshold("max_nodes", 16, 1, 4096, "none", integer=True, doc="nodes the planner may span"),
    # bench
    Threshold("bench_min_concurrency_levels", 3, 1, 64, "min", integer=True,
              doc="distinct concurrency levels a baseline must sweep"),
    Threshold("bench_max_failure_ratio", 0.0, 0.0, 1.0, "max", doc="failed / all requests of a run, at most"),
    # bench physics and length (verdicts.bench): a decode step cannot beat the memory bandwidth, a level is long
    # enough for its percentiles to mean something, and the counts agree with each other and with what was asked
    Threshold("bench_tpot_floor_factor", 0.5, 0.0, 1.0, "min", low_open=True,
              doc="TPOT p50 at least this × the bandwidth floor (bytes a decode step reads per device / bandwidth)"),
    Threshold("bench_rate_tolerance", 0.25, 0.0, 10.0, "max",
              doc="output tok/s at most concurrency × 1000 / TPOT × (1 + this)"),
    Threshold("bench_littles_law_tolerance", 0.1, 0.0, 10.0, "max",
              doc="req/s × mean end-to-end (the mean in flight) at most concurrency × (1 + this)"),
    Threshold("bench_output_len_tolerance", 0.1, 0.0, 1.0, "max",
              doc="ignore-EOS runs: mean output tokens per request within this fraction of output_len"),
    Threshold("bench_repeat_max_speedup", 1.1, 1.0, 100.0, "max",
              doc="repeated-prompt probe tok/s at most this × the fresh-prompt tok/s"),
    Threshold("bench_min_requests", 16, 1, 100_000, "min", integer=True,
              doc="requests issued per concurrency level, at least"),
    Threshold("bench_min_seconds", 2.0, 0.0, 86_400.0, "min", doc="seconds per concurrency level, at least"),
    Threshold("bench_p99_min_samples", 100, 1, 1_000_000, "none", integer=True,
              doc="below this many samples a level's p99 is its maximum"),
    # eval
    Threshold("eval_rtol", 0.05, 0.0, 1.0, "max", doc="per task: target >= reference x (1 - rtol)"),
    Threshold("eval_accuracy_tol", 0.07, 0.0, 1.0, "max", doc="|accuracy_target - accuracy_ref|, at most"),
    Threshold("eval_perplexity_rel_tol", 0.02, 0.0, INF, "max", doc="eval texts' relative perplexity difference"),
    # eval's acting tasks: code run in the sandbox (humaneval), the multi-turn tool environment (agent_kv)
    Threshold("eval_code_pass_tol", 0.05, 0.0, 1.0, "max",
              doc="humaneval: target pass@1 >= reference pass@1 - this"),
    Threshold("eval_agent_success_tol", 0.1, 0.0, 1.0, "max",
              doc="agent_kv: target success rate >= reference success rate - this"),
    Threshold("eval_agent_min_turn_agreement", 0.8, 0.0, 1.0, "min",
              doc="agent_kv: target actions equal to the reference's, turn by turn, at least"),
    # the conformance stage (contract/conformance.py): the served OpenAI endpoint against the reference
    Threshold("conformance_min_trigger_agreement", 0.98, 0.0, 1.0, "min",
              doc="tool-call trigger (call or no call) equal to the reference's, of the prompts, at least"),
    Threshold("conformance_min_arguments_valid", 0.98, 0.0, 1.0, "min",
              doc="unforced tool calls whose arguments are valid against their schema, at least"),
    Threshold("conformance_min_forced_valid", 1.0, 0.0, 1.0, "min",
              doc="forced tool calls (tool_choice required or named) valid, at least"),
    Threshold("conformance_min_schema_valid", 1.0, 0.0, 1.0, "min",
              doc="json_schema response_format answers valid against the schema, at least"),
    Threshold("conformance_repeats", 1, 1, 100, "min", integer=True,
              doc="times the conformance prompt set is sent (the vendor verifiers repeat ten times)"),
    # the portal's challenges (docs/references.md): the power rule sizing eval samples
    Threshold("challenge_theta", 0.1, 0.0, 1.0, "max", low_open=True,
              doc="the accuracy drop a challenge is sized to detect (larger: fewer items)"),
    Threshold("challenge_alpha", 0.05, 0.0, 0.5, "max", low_open=True,
              doc="the challenge's one-sided false-alarm rate (larger: fewer items)"),
    Threshold("challenge_beta", 0.2, 0.0, 0.5, "max", low_open=True,
              doc="the challenge's miss rate (larger: fewer items)"),
    # the challenge's acting items (docs/references.md): fixed sample sizes, small by default (the target answers
    # each with hundreds of generated tokens, and a CPU host serves slowly); 0 draws none of that kind
    Threshold("challenge_code_items", 4, 0, 164, "min", integer=True,
              doc="HumanEval problems a challenge draws from the pool (capped at the pool)"),
    Threshold("challenge_agent_episodes", 4, 0, 256, "min", integer=True,
              doc="agent_kv episodes a challenge draws from the pool (capped at the pool)"),
)}

DEFAULTS: dict[str, float] = {key: t.default for key, t in TABLE.items()}

# The groups stages read (kept for the stage modules that import them).
OPS: dict[str, float] = {k: DEFAULTS[k] for k in ("op_cosine", "op_max_rel_err", "moe_topk_agreement",
                                                    "near_tie_margin")}
ALIGN: dict[str, float] = {k: DEFAULTS[k] for k in ("op_cosine", "op_max_rel_err", "layer_cosine", "e2e_top_k",
                                                      "perplexity_rel_tol")}
EVAL: dict[str, float] = {k: DEFAULTS[k] for k in ("eval_accuracy_tol", "eval_perplexity_rel_tol")}
OTHER_KEYS: tuple[str, ...] = tuple(k for k in TABLE if k not in {*OPS, *ALIGN, *EVAL})


def known_keys() -> set[str]:
    """Every threshold key some stage or verdict reads."""
    return set(TABLE)


def check_thresholds(values: Mapping[str, Any], *, context_length: int | None = None) -> dict[str, float]:
    """A job's threshold overrides as floats (ints for integer keys). An unknown key, a non-number or a value
    outside its range is a ValueError naming the key (and the range)."""
    if not isinstance(values, Mapping):
        raise ValueError("thresholds must be an object mapping threshold names to numbers")
    out: dict[str, float] = {}
    for key, value in values.items():
        spec = TABLE.get(key)
        if spec is None:
            raise ValueError(f"threshold {key!r} is not read by any stage; known: {', '.join(sorted(TABLE))}")
        if isinstance(value, bool):
            raise ValueError(f"threshold {key}: {value!r} is not a number")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"threshold {key}: {value!r} is not a number") from None
        spec.check(number, context_length=context_length)
        out[key] = int(number) if spec.integer else number
    return out


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


def describe() -> list[dict[str, Any]]:
    """The table as data (docs, the API): key, default, range, which way is looser."""
    return [{"key": t.key, "default": None if math.isinf(t.default) else t.default, "range": t.describe_range(),
             "stricter_is": {"min": "higher", "max": "lower", "none": "n/a"}[t.strict], "doc": t.doc}
            for t in TABLE.values()]
