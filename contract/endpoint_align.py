"""Endpoint align: what an external engine's ``align`` section is (docs/engines.md) and the pure arithmetic both
sides share, so the portal recomputes every number from the rows the agent posts.

An external engine exposes no operators or activations; its align is (1) end to end through the endpoint (the
fixed prompts against the local transformers reference, and a certify job's challenge items as raw outputs the
portal scores) and (2) the KV-cache self-consistency check: the top-k logprobs of a decoded continuation against
those of the same text prefilled again, on a prefix-cache miss and on a hit (the same prompt repeated after a
different one), with a no-op control (a run against itself: 0) and a perturbed prompt (its difference must stand
well above the agreeing cases': the check can see a difference). Pure: no torch, no Django."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

METHOD = "endpoint"  # the align section's ``method`` for an external engine
# the KV self-check's cases: the agreeing ones must stay under the bound, the control ~0, the perturbed above it
AGREEING_CASES: tuple[str, ...] = ("miss", "hit", "hit_vs_miss")
NOOP_CASE, PERTURBED_CASE = "noop", "perturbed"
CASES: tuple[str, ...] = (*AGREEING_CASES, NOOP_CASE, PERTURBED_CASE)
NOOP_MAX_KL = 1e-9  # a run compared with itself: anything above is arithmetic that invents differences
# the perturbed prompt is *seen* when its mean KL is above this floor and this many times the miss case's (the
# same prompt prefilled on a cold cache: the engine's own decode-vs-prefill noise): an engine whose logprobs ignore
# the prompt (or a check that compares nothing) shows ~0 everywhere
PERTURBED_MIN_KL = 1e-7
PERTURBED_MIN_RATIO = 10.0
MAX_POSITIONS = 4096  # per row


def top_map(entries: Any) -> dict[int, float] | None:
    """One position's top-k list (``[{"token", "logprob"}, …]``) as token -> logprob; None when malformed (a
    token that is not an id, a logprob that is not a finite number ≤ 0)."""
    if not isinstance(entries, list) or not entries:
        return None
    out: dict[int, float] = {}
    for e in entries:
        if not isinstance(e, Mapping):
            return None
        token, lp = e.get("token"), e.get("logprob")
        if isinstance(token, bool) or not isinstance(token, int) or isinstance(lp, bool) \
                or not isinstance(lp, int | float) or not math.isfinite(lp) or lp > 1e-6:
            return None
        out.setdefault(int(token), float(lp))
    return out


def topk_kl(p_entries: Any, q_entries: Any) -> float | None:
    """KL(P ‖ Q) over P's top-k tokens at one position, both renormalised over those tokens. A token of P's
    top-k missing from Q's list gets Q's smallest listed logprob (the most it can have: it ranked below every
    listed one). None when either list is malformed."""
    p, q = top_map(p_entries), top_map(q_entries)
    if p is None or q is None:
        return None
    floor = min(q.values())
    ps = {t: math.exp(lp) for t, lp in p.items()}
    qs = {t: math.exp(q.get(t, floor)) for t in p}
    zp, zq = sum(ps.values()), sum(qs.values())
    if zp <= 0 or zq <= 0:
        return None
    kl = sum((pv / zp) * (math.log(pv / zp) - math.log(qs[t] / zq)) for t, pv in ps.items() if pv > 0)
    return max(0.0, kl)


def row_kl(a: Sequence[Any], b: Sequence[Any]) -> tuple[float, float] | None:
    """(mean, max) of ``topk_kl`` over the positions of two equally long per-position lists; None when they
    differ in length, are empty or longer than ``MAX_POSITIONS``, or a position is malformed."""
    if not isinstance(a, list) or not isinstance(b, list) or not a or len(a) != len(b) or len(a) > MAX_POSITIONS:
        return None
    kls = [topk_kl(x, y) for x, y in zip(a, b, strict=True)]
    if any(k is None for k in kls):
        return None
    values = [float(k) for k in kls if k is not None]
    return sum(values) / len(values), max(values)


def perturbed_floor(miss_mean: float | None) -> float:
    """The mean KL a perturbed prompt must exceed to count as seen, given the miss case's mean."""
    return max(PERTURBED_MIN_KL, PERTURBED_MIN_RATIO * (miss_mean or 0.0))


def chosen_tokens(positions: Sequence[Any]) -> list[int | None]:
    """The chosen token of each position (its list's first entry, as ``top_entries`` writes it)."""
    out: list[int | None] = []
    for entries in positions:
        first = entries[0] if isinstance(entries, list) and entries and isinstance(entries[0], Mapping) else {}
        token = first.get("token")
        out.append(token if isinstance(token, int) and not isinstance(token, bool) else None)
    return out
