"""The align section's ``e2e_original`` block: a quantised release against its unquantised original end to end
(``agents/pipeline/stages/align/original.py``, docs/stage-report.md). Its value types are checked with the rest of
the section (``contract.sections``); ``problems`` adds the bounds both sides hold it to, so a block that claims a
token match of 1.4 or a negative KL is refused whole, naming the value."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

METHOD = "original (transformers fp32) greedy decode; the quantised target scored on the same prefixes"
MAX_PROMPTS = 64
MAX_TOKENS = 100_000
MAX_TOP_K = 100

TYPES: dict[str, str] = {"method": "text", "original": "text", "informational": "boolean", "error": "text",
                         "prompts": "integer", "tokens": "integer", "top_k": "integer", "token_match_rate": "number",
                         "exact": "boolean", "first_divergence": "list", "kl_mean": "number", "kl_max": "number",
                         "topk_kl_mean": "number", "topk_kl_max": "number", "perplexity_original": "number",
                         "perplexity_target": "number", "perplexity_rel_diff": "number"}
# (low, high) of each bounded number; None: unbounded on that side
BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "prompts": (0, MAX_PROMPTS), "tokens": (0, MAX_TOKENS), "top_k": (1, MAX_TOP_K), "token_match_rate": (0, 1),
    "kl_mean": (0, None), "kl_max": (0, None), "topk_kl_mean": (0, None), "topk_kl_max": (0, None),
    "perplexity_original": (1, None), "perplexity_target": (1, None), "perplexity_rel_diff": (-1, None)}
MAX_TEXT = 1000


def problems(block: Mapping[str, Any], at: str = "stages.align.e2e_original") -> list[tuple[str, str]]:
    """``(path, message)`` for every value out of its bounds (types are ``contract.sections``' to check; a
    value of the wrong type is skipped here)."""
    found: list[tuple[str, str]] = []
    for key, (low, high) in BOUNDS.items():
        value = block.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            continue
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"at least {low}"
            found.append((f"{at}.{key}", f"{value:g} is out of range: must be {span}"))
    for key in ("method", "original", "error"):
        value = block.get(key)
        if isinstance(value, str) and len(value) > MAX_TEXT:
            found.append((f"{at}.{key}", f"is {len(value)} characters long; at most {MAX_TEXT} are accepted"))
    first = block.get("first_divergence")
    if isinstance(first, list):
        if len(first) > MAX_PROMPTS:
            found.append((f"{at}.first_divergence", f"has {len(first)} items; at most {MAX_PROMPTS} are accepted"))
        elif any(v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_TOKENS)
                 for v in first):
            found.append((f"{at}.first_divergence", f"must hold positions from 0 to {MAX_TOKENS} or null"))
    rate, tokens = block.get("token_match_rate"), block.get("tokens")
    if block.get("exact") is True and isinstance(rate, int | float) and rate != 1:
        found.append((f"{at}.exact", f"is true but token_match_rate is {rate:g}"))
    if tokens == 0 and block.get("error") is None and "token_match_rate" in block:
        found.append((f"{at}.tokens", "is 0: a comparison of no tokens measures nothing"))
    return found
