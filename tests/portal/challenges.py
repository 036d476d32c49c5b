"""A stand-in model for reference and challenge tests: deterministic outputs per pool item, so a test can post
the reference a reference job computes (from its ``reference_pool``) and the raw outputs a certify job answers
(from its ``challenge``) as the same weights would. Answers come from the bundled pool (the test is the truth)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from contract.challenges import pool as cp
from contract.suites import agent_env
from contract.suites import humaneval as code_suite

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


def code_answer(item: dict[str, Any]) -> dict[str, Any]:
    """A completion that returns None (fails its tests), the same for every run of the stand-in model."""
    completion = f"    return None  # {item['id']}\n"
    return {"id": item["id"], "completion": completion, "sha256": code_suite.digest(completion), "passed": False,
            "status": "failed"}


def solving_actions(seed: int) -> list[str]:
    """Actions that reach the goal of episode ``seed`` and finish (the stand-in model solves every episode)."""
    episode = agent_env.Episode.from_seed(seed)
    actions = [{"tool": "set", "args": {"key": k, "value": v}} for k, v in sorted(episode.goal.items())
               if episode.store.get(k) != v]
    actions += [{"tool": "delete", "args": {"key": k}} for k in sorted(episode.store) if k not in episode.goal]
    actions.append({"tool": "finish", "args": {}})
    return [json.dumps(a, sort_keys=True) for a in actions]


def agent_answer(item: dict[str, Any]) -> dict[str, Any]:
    return {"id": item["id"], "actions": solving_actions(item["seed"]), "success": True}


ANSWER = {"e2e": e2e_answer, "mc": mc_answer, "qa": qa_answer, "ppl": ppl_answer, "needle": needle_answer}
ANSWER.update(code=code_answer, agent=agent_answer)


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
    for kind in ("mc", "qa", "ppl", "needle", "code", "agent"):
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


# --- making a factory job an attempt the portal dispatched, and answering its challenge ------------------------------

def stand_in_reference(release: Any) -> Any:
    """A finished reference of ``release`` for the current pool: the stand-in model's outputs (as a reference
    job's section stores them) and full needle accuracy at every length of the release's grid."""
    from django.utils import timezone

    from apps.references.models import ReferenceRun, ReferenceState
    from apps.references.services import finished_reference

    pool = cp.pool()
    run = finished_reference(release.pk, pool.version)
    if run is not None:
        return run
    outputs: dict[str, Any] = {kind: {item["id"]: {k: v for k, v in ANSWER[kind](item).items() if k != "id"}
                                      for item in pool.agent_items(kind)} for kind in cp.POOL_KINDS}
    outputs["needle_accuracy"] = {str(n): {"n": 10, "correct": 10, "accuracy": 1.0, "wilson_low": 0.72,
                                           "wilson_high": 1.0} for n in cp.needle_lengths(release.context_length)}
    return ReferenceRun.objects.create(release=release, pool_version=pool.version, source="stand-in",
                                       state=ReferenceState.FINISHED, outputs=outputs, finished_at=timezone.now())


def dispatched(job: Any) -> Any:
    """``job`` as the portal's dispatch leaves it (an attempt, its nonce, its drawn challenge), its release with a
    finished stand-in reference; returns the job's challenge as sent."""
    import secrets

    from apps.jobs.models import Job
    from apps.references.models import Challenge
    from apps.references.services import draw_challenge

    stand_in_reference(job.model)
    job.refresh_from_db()
    challenge = Challenge.objects.filter(job=job, attempt=job.attempts, nonce=job.nonce).first() if job.nonce else None
    if challenge is None:
        if not job.nonce:
            Job.objects.filter(pk=job.pk).update(attempts=max(1, job.attempts), nonce=secrets.token_hex(16))
            job.refresh_from_db()
        challenge = draw_challenge(job)
    return challenge.items if challenge else None


def answered(job: Any, sections: dict[str, Any]) -> dict[str, Any]:
    """``sections`` with the honest raw outputs of ``job``'s challenge in its align (when it has an e2e part) and
    eval sections, the job made a dispatched attempt first (``dispatched``). A section that already carries raw
    outputs keeps its own."""
    challenge = dispatched(job)
    if challenge is None:
        return sections
    raw = raw_outputs(challenge)
    out = dict(sections)
    if isinstance(out.get("align"), dict) and isinstance(out["align"].get("e2e"), dict) \
            and "raw" not in out["align"]["e2e"]:
        out["align"] = copy.deepcopy(out["align"])
        out["align"]["e2e"]["raw"] = raw["align"]
    if isinstance(out.get("eval"), dict) and "raw" not in out["eval"]:
        out["eval"] = {**copy.deepcopy(out["eval"]), "raw": raw["eval"]}
    return out


def answer(job: Any, stage: str, section: dict[str, Any]) -> dict[str, Any]:
    """One section of ``job`` with its raw outputs (align, eval; others as they are)."""
    return answered(job, {stage: section})[stage]
