"""How the portal scores the challenge's acting items (docs/references.md): HumanEval completions (``code``) and
agent_kv episodes (``agent``), target against the reference it holds.

* ``code``: the agent posts its completion, the completion's sha256 (of the text as run, after the stop cut) and
  its sandbox's pass/fail. The portal checks the hash is the completion's, compares it with the reference's: an
  identical completion takes the reference run's result (trusted hardware ran that very program), and an
  identical completion reported with the other result is a dispute that fails the item. A completion unlike the
  reference's keeps the agent's sandbox result until the portal's worker re-runs it (``apps.evidence.reruns``, in
  ``contract.sandbox``, never in the web process): a re-run result other than the one claimed is a dispute too;
  until then that item is the agent's word, marked per item (``result_from``).
* ``agent``: the agent posts its actions, one per turn. The portal replays them in ``contract.suites.agent_env``
  (pure python, deterministic from the episode's seed) and decides success itself, so a claimed success is
  never taken; turn agreement compares the replayed tool calls with the reference's, turn by turn (a line that is
  no tool call counts as "invalid" on either side, whatever its text).

The reference's completions and actions never leave the portal: the rows name the target's only.

Pure: standard library only (no torch, no Django)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from contract.suites import agent_env
from contract.suites import humaneval as code_suite

MAX_COMPLETION = 16_384  # characters of one completion (384 tokens, cut at the first stop sequence)
MAX_ACTION = 1024  # characters of one action line
MAX_STATUS = 64
SHOWN = 2000  # characters of a target completion kept in the stored scores


def item_problem(kind: str, raw: Mapping[str, Any], drawn: Mapping[str, Any]) -> str | None:
    """Why one raw code or agent answer does not fit its item (None when it does)."""
    if kind == "code":
        completion, digest = raw.get("completion"), raw.get("sha256")
        if not isinstance(completion, str) or len(completion) > MAX_COMPLETION:
            return f"completion must be a string of at most {MAX_COMPLETION} characters"
        if not isinstance(raw.get("passed"), bool):
            return "passed must be true or false (the sandbox's result)"
        status = raw.get("status", "")
        if not isinstance(status, str) or len(status) > MAX_STATUS:
            return f"status must be a string of at most {MAX_STATUS} characters"
        if not isinstance(digest, str) or digest != code_suite.digest(completion):
            return "sha256 is not the sha256 of the completion as run (cut at the first stop sequence)"
        return None
    actions, turns = raw.get("actions"), int(drawn.get("max_turns") or agent_env.MAX_TURNS)
    if (not isinstance(actions, list) or len(actions) > turns
            or not all(isinstance(a, str) and len(a) <= MAX_ACTION and "\n" not in a for a in actions)):
        return f"actions must be a list of at most {turns} one-line strings of at most {MAX_ACTION} characters"
    try:
        replay(int(drawn["seed"]), actions)
    except ValueError as exc:
        return str(exc)
    return None


def replay(seed: int, actions: Sequence[str]) -> agent_env.Episode:
    """The episode of ``seed`` with ``actions`` applied in order, as the portal plays it: an action after the
    episode ended (``finish`` or the last turn) is a ValueError naming the turn; an episode whose actions stop
    before either ended early (the agent's context was full) and fails."""
    episode = agent_env.Episode.from_seed(seed)
    for turn, action in enumerate(actions):
        if episode.done:
            raise ValueError(f"action {turn + 1} comes after the episode ended at turn {turn}")
        episode.step(action)
    if not episode.done:
        episode.truncated = True
    return episode


def turn_key(action: str) -> str:
    """What a turn is compared by: the tool call the environment applied (canonical JSON), or ``invalid`` for a
    line that is no tool call (the environment applies nothing and answers an error either way; the text of two
    such lines, which near-ties between engines reshuffle, is not an action)."""
    parsed, _ = agent_env.parse(action.strip())
    return json.dumps(parsed, sort_keys=True) if parsed is not None else "invalid"


def _rate(values: Sequence[bool]) -> float | None:
    return sum(values) / len(values) if values else None


def score_code(drawn: Sequence[Mapping[str, Any]], answers: Mapping[str, Mapping[str, Any]],
               reference: Mapping[str, Mapping[str, Any]],
               reruns: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Per problem: the target's result (the reference run's for an identical completion; the portal's own re-run
    of that very completion, by sha256, when it has one; else the agent's sandbox's), disputes (a known result
    other than the one claimed: the item fails), pass@1 of both sides, agreement."""
    rows = []
    for item in drawn:
        item_id = str(item["id"])
        tgt, ref = answers[item_id], reference[item_id]
        same = tgt["sha256"] == ref.get("sha256")
        rerun = (reruns or {}).get(item_id)
        rerun = rerun if isinstance(rerun, Mapping) and rerun.get("sha256") == tgt["sha256"] else None
        if same:
            known, where = bool(ref.get("passed")), "the reference run (identical completion)"
        elif rerun is not None:
            known, where = bool(rerun.get("passed")), "the portal's re-run"
        else:
            known, where = None, "the agent's sandbox"
        dispute = known is not None and bool(tgt["passed"]) != known
        target = bool(tgt["passed"]) if known is None else known and not dispute
        rows.append({"id": item_id, "task_id": str(item.get("task_id", "")), "reference": bool(ref.get("passed")),
                     "target": target, "claimed": bool(tgt["passed"]), "same_completion": same, "dispute": dispute,
                     "result_from": where,
                     "target_status": str(tgt.get("status", ""))[:MAX_STATUS],
                     "target_sha256": tgt["sha256"], "completion": str(tgt["completion"])[:SHOWN]})
    ref_rate, tgt_rate = _rate([r["reference"] for r in rows]), _rate([r["target"] for r in rows])
    return {"n": len(rows), "pass_at_1": {"reference": ref_rate, "target": tgt_rate},
            "agreement": _rate([r["reference"] == r["target"] for r in rows]),
            "same_completions": _rate([r["same_completion"] for r in rows]),
            "disputes": [r["id"] for r in rows if r["dispute"]],
            "agents_word": [r["id"] for r in rows if r["result_from"] == "the agent's sandbox"], "rows": rows}


def score_agent(drawn: Sequence[Mapping[str, Any]], answers: Mapping[str, Mapping[str, Any]],
                reference: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per episode, both sides replayed by the portal: success (end state equals the goal's), turn agreement
    (the target's action at turn i equal to the reference's, over the longer trajectory; a missing turn
    disagrees), and claims of success the replay does not bear out."""
    rows, agreed, total = [], 0, 0
    for item in drawn:
        item_id, seed = str(item["id"]), int(item["seed"])
        tgt = replay(seed, answers[item_id]["actions"])
        ref = replay(seed, reference[item_id]["actions"])
        turns = max(len(ref.actions), len(tgt.actions))
        same = sum(turn_key(a) == turn_key(b) for a, b in zip(ref.actions, tgt.actions, strict=False))
        agreed, total = agreed + same, total + turns
        claimed = answers[item_id].get("success")
        rows.append({"id": item_id, "seed": seed, "task": tgt.task, "reference": ref.success, "target": tgt.success,
                     "claimed": claimed if isinstance(claimed, bool) else None,
                     "false_claim": claimed is True and not tgt.success,
                     "turns": {"reference": len(ref.actions), "target": len(tgt.actions)},
                     "turn_agreement": same / turns if turns else 1.0, "actions": [a[:200] for a in tgt.actions]})
    return {"n": len(rows), "success": {"reference": _rate([r["reference"] for r in rows]),
                                        "target": _rate([r["target"] for r in rows])},
            "turn_agreement": agreed / total if total else 1.0,
            "false_claims": [r["id"] for r in rows if r["false_claim"]], "rows": rows}
