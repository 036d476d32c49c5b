"""A stand-in model for reference and challenge tests: deterministic outputs per pool item, so a test can post
the reference a reference job computes (from its ``reference_pool``) and the raw outputs a certify job answers
(from its ``challenge``) as the same weights would. Answers come from the bundled pool (the test is the truth)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from agents.pipeline import challenge_pool as cp

VOCAB = 32000


def _tokens(item_id: str, n: int) -> list[int]:
    digest = hashlib.sha256(item_id.encode()).digest()
    return [(digest[i % 32] * 131 + i * 7919) % (VOCAB - 10) for i in range(n)]


def e2e_answer(item: dict[str, Any]) -> dict[str, Any]:
    tokens = _tokens(item["id"], item["max_tokens"])
    tops = [[{"token": t, "logprob": -0.1}, *({"token": t + j, "logprob": -2.0 - j} for j in range(1, 5))]
            for t in tokens]
    return {"id": item["id"], "tokens": tokens, "top_logprobs": tops, "prompt_tokens": 12}


def mc_answer(item: dict[str, Any]) -> dict[str, Any]:
    answer = cp.pool().answers["mc"][item["id"]]["answer"]
    lls = [-0.5 if i == answer else -3.0 - i for i in range(len(item["choices"]))]
    return {"id": item["id"], "loglikelihoods": lls, "greedy": [i == answer for i in range(len(lls))]}


def qa_answer(item: dict[str, Any]) -> dict[str, Any]:
    return {"id": item["id"], "text": " " + cp.pool().answers["qa"][item["id"]]["answer"] + "\n"}


def ppl_answer(item: dict[str, Any]) -> dict[str, Any]:
    words = cp.pool().answers["ppl"][item["id"]]["words"]
    return {"id": item["id"], "loglikelihood": -2.0 * words, "tokens": words + 3}


def needle_answer(item: dict[str, Any]) -> dict[str, Any]:
    return {"id": item["id"], "text": f" {item['value']}."}


ANSWER = {"e2e": e2e_answer, "mc": mc_answer, "qa": qa_answer, "ppl": ppl_answer, "needle": needle_answer}


def reference_section(payload: dict[str, Any]) -> dict[str, Any]:
    """The ``reference`` section a reference job posts for its payload's ``reference_pool``."""
    pool = payload["reference_pool"]
    section: dict[str, Any] = {"pool_version": pool["pool_version"], "nonce": payload["nonce"], "top_k": 5}
    for kind in cp.KINDS:
        section[kind] = [ANSWER[kind](item) for item in pool[kind]]
    return section


def raw_outputs(challenge: dict[str, Any]) -> dict[str, Any]:
    """Honest raw outputs of a challenge: ``{"align": e2e raw, "eval": eval raw}``."""
    eval_raw = {"nonce": challenge["nonce"]}
    for kind in ("mc", "qa", "ppl", "needle"):
        eval_raw[kind] = [ANSWER[kind](item) for item in challenge.get(kind) or []]
    return {"align": {"nonce": challenge["nonce"], "items": [e2e_answer(i) for i in challenge.get("e2e") or []]},
            "eval": eval_raw}


def with_raw(align: dict[str, Any] | None, eval_section: dict[str, Any] | None, raw: dict[str, Any]
             ) -> dict[str, dict[str, Any]]:
    """Align and eval sections carrying ``raw`` (copies)."""
    out = {}
    if align is not None:
        out["align"] = copy.deepcopy(align)
        out["align"]["e2e"]["raw"] = copy.deepcopy(raw["align"])
    if eval_section is not None:
        out["eval"] = {**copy.deepcopy(eval_section), "raw": copy.deepcopy(raw["eval"])}
    return out
