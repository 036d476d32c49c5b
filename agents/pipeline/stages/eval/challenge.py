"""The ``eval`` stage of a certify job that carries the portal's challenge (docs/references.md): exactly the drawn
mc, qa, ppl, needle, code and agent items, answered by the SERVED target (``support.lm_backends.ServedLM`` on the server the serve
stage left, or one the eval stage started), posted as raw outputs for the portal to score against the reference
it holds. No ``transformers`` reference is loaded: the agent holds none of the answers and claims no score
(``passed`` is None, ``scored_by`` "portal"); the runner then does not stop on its own verdict of the section."""

from __future__ import annotations

import time
from typing import Any

from agents.pipeline.support import challenge_acting as acting
from agents.pipeline.support import challenge_answers as answers
from agents.pipeline.support.context import StageContext

WHERE = "challenge"


def has_challenge(ctx: StageContext) -> bool:
    return isinstance(ctx.challenge, dict)


def run(ctx: StageContext, target: Any, tok: Any, url: str, served_context: int) -> dict[str, Any]:
    """The eval section of a challenge: ``raw`` {nonce, mc, qa, ppl, needle, code, agent} and what produced it
    (code answers carry the agent's sandbox result; the portal replays agent actions itself)."""
    challenge = ctx.challenge or {}
    nonce = answers.nonce_of(challenge, WHERE, ctx.nonce)
    items = answers.parse_items(challenge, WHERE, answers.EVAL_KINDS + answers.ACTING_KINDS)
    notes: list[str] = []
    window = answers.ppl_window(ctx)
    if window >= served_context:  # the server's context is shorter than the model's: the windows must fit it
        notes.append(f"perplexity windows of {served_context - 1} tokens (the served context), not the "
                     f"reference's {window}")
        window = served_context - 1
    if not any(items.values()):
        notes.append("the challenge has no eval items (mc, qa, ppl, needle, code, agent): nothing to answer")
    raw, seconds = answers.answer_eval(target, tok, items, ctx, "eval challenge", context=served_context,
                                       window=window)
    for kind, answer in (("code", acting.answer_code), ("agent", acting.answer_agent)):
        if items[kind]:
            t0 = time.perf_counter()
            extra = {"where": WHERE} if kind == "code" else {}
            raw[kind] = answer(target, tok, items[kind], ctx, "eval challenge", context=served_context, **extra)
            seconds[kind] = round(time.perf_counter() - t0, 3)
    notes += [f"needle {row['id']}: {row['error']}" for row in raw.get("needle", []) if row.get("error")]
    kinds = answers.EVAL_KINDS + answers.ACTING_KINDS
    counts = {kind: len(items[kind]) for kind in kinds}
    summary = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "no items"
    return {
        "passed": None,  # no claim: the portal scores the raw outputs against its reference
        "scored_by": "portal",
        "endpoint": url,
        "reference": None,
        "raw": {"nonce": nonce, **{kind: raw.get(kind, []) for kind in kinds}},
        "challenge": {"items": counts},
        "ppl_window": window,
        "served_context": served_context,
        "seconds": seconds,
        "summary": f"challenge answered by the served target ({summary}); scored by the portal",
        "notes": notes,
    }
