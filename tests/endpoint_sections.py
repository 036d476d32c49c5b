"""An external engine's endpoint align section (``contract.endpoint_align``) as an agent posts it, for the
verdict and portal tests: e2e (the fixed prompts' numbers; a certify job adds its ``raw``) and ``kv_self`` rows
whose KLs the judge recomputes. ``kv_rows(hit=…, perturbed=…)`` plants a difference."""

from __future__ import annotations

import copy
from typing import Any

from contract.endpoint_align import row_kl

POSITIONS = 8


def _position(j: int, top: float, second: float) -> list[dict[str, Any]]:
    return [{"token": 100 + j, "logprob": top}, {"token": 200 + j, "logprob": second}, {"token": 7, "logprob": -4.0}]


def kv_rows(hit: float = 0.0, perturbed: float = 1.5, noop_differs: bool = False) -> list[dict[str, Any]]:
    """miss, hit, hit_vs_miss, noop and perturbed rows; ``hit`` and ``perturbed`` shift the second token's logprob
    (0: the same numbers; the default perturbation is clearly seen)."""
    decoded = [_position(j, -0.2, -1.8) for j in range(POSITIONS)]
    same = [_position(j, -0.2, -1.8 + 1e-7) for j in range(POSITIONS)]
    hit_rows = [_position(j, -0.2, -1.8 + hit) for j in range(POSITIONS)]
    moved = [_position(j, -0.2 - perturbed, -1.8 + perturbed) for j in range(POSITIONS)]
    noop = same if noop_differs else decoded
    rows = [("miss", decoded, same), ("hit", hit_rows, same), ("hit_vs_miss", hit_rows, decoded),
            ("noop", decoded, noop), ("perturbed", decoded, moved)]
    out = []
    for case, a, b in rows:
        mean, peak = row_kl(a, b)
        out.append({"case": case, "prompt": "A", "positions": POSITIONS, "decoded": copy.deepcopy(a),
                    "prefilled": copy.deepcopy(b), "mean_kl": mean, "max_kl": peak, "token_mismatches": 0})
    return out


def endpoint_align(engine: str = "vllm", **kv: Any) -> dict[str, Any]:
    """A passing endpoint align section of ``engine`` (an external one)."""
    return {"method": "endpoint", "engine": engine, "endpoint": "http://127.0.0.1:8100", "served_model": "m",
            "passed": True, "thresholds": {"kv_self_max_mean_kl": 0.01}, "reference": "transformers fp32 cpu",
            "not_applicable": {"ops": "not visible", "layers": "not visible"},
            "e2e": {"prompts": 3, "tokens": 48, "token_match_rate": 1.0, "hard_divergences": 0, "divergences": [],
                    "perplexity_ref": 12.1, "perplexity_target": 12.1, "passed": True},
            "kv_self": {"top_k": 5, "bound": 0.01, "new_tokens": POSITIONS, "rows": kv_rows(**kv), "passed": True},
            "checks": {"e2e": True, "kv_self": True}, "complete": True}
