"""Every threshold a job may override, with its default: one table, importable without torch (the portal
checks a job's overrides against it when the job is submitted; ``day0 adapt --threshold`` does too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# operator checks (align_ops), also the per-operator gate of the align stage
OPS: dict[str, float] = {
    "op_cosine": 0.999,
    "op_max_rel_err": 1e-2,
    "moe_topk_agreement": 1.0,  # of the tokens that are not near-ties
    "near_tie_margin": 1e-3,
}
# the align stage (align_common, align_layers, align_e2e)
ALIGN: dict[str, float] = {
    "op_cosine": OPS["op_cosine"],
    "op_max_rel_err": OPS["op_max_rel_err"],
    "layer_cosine": 0.99,
    "e2e_top_k": 5,  # near-tie: each side's token within the other's top-k
    "perplexity_rel_tol": 0.05,  # |ppl_target - ppl_ref| / ppl_ref
}
# the eval stage
EVAL: dict[str, float] = {"eval_accuracy_tol": 0.07, "eval_perplexity_rel_tol": 0.02}
# keys read by stages that keep their default beside the code reading it (align_kv, load, plan, align_layers)
OTHER_KEYS: tuple[str, ...] = ("kv_cache_max_abs_err", "kv_cache_max_len", "fail_on_nonfinite", "max_nodes",
                               "layer_max_rel_err")


def known_keys() -> set[str]:
    """Every threshold key some stage reads."""
    return {*OPS, *ALIGN, *EVAL, *OTHER_KEYS}


def check_thresholds(values: Mapping[str, Any]) -> dict[str, float]:
    """A job's threshold overrides as floats; an unknown key or a non-number is a ValueError naming it."""
    known = known_keys()
    out: dict[str, float] = {}
    for key, value in values.items():
        if key not in known:
            raise ValueError(f"threshold {key!r} is not read by any stage; known: {', '.join(sorted(known))}")
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"threshold {key}: {value!r} is not a number") from None
    return out
