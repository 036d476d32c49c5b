"""The challenge's acting items scored by the portal (contract/challenges/acting.py, verdicts.py): HumanEval
completions compared with the reference's by sha256 (an identical completion takes the reference run's result, a
disputed one fails), agent_kv actions replayed by the portal (success is never the agent's word), and the
forgeries: a claimed pass on a reference-identical failing completion, actions that do not reach the goal with a
claimed success, a wrong nonce, a hash that is not the completion's."""

from __future__ import annotations

import json

import pytest

from contract import verdicts
from contract.challenges import acting
from contract.challenges import pool as cp
from contract.challenges.verdicts import ChallengeJudge
from contract.suites import agent_env
from contract.suites import humaneval as code_suite
from tests.portal.challenges import solving_actions

FAILING = "    return None\n"
PASSING = "    return number % 1.0\n"  # HumanEval/2 (truncate_number)
FINISH = json.dumps({"tool": "finish", "args": {}}, sort_keys=True)


def _code(item_id: str, completion: str, passed: bool) -> dict:
    return {"id": item_id, "completion": completion, "sha256": code_suite.digest(completion), "passed": passed,
            "status": "passed" if passed else "failed"}


CODE_ITEMS = [cp.pool().agent_items("code", ["humaneval-002", "humaneval-000"])[i] for i in range(2)]
AGENT_ITEMS = cp.pool().agent_items("agent", ["agent-000", "agent-001"])
CHALLENGE = {"nonce": "n1", "top_k": 5, "code": CODE_ITEMS, "agent": AGENT_ITEMS}
REFERENCE = {"code": {"humaneval-002": {k: v for k, v in _code("x", PASSING, True).items() if k != "id"},
                      "humaneval-000": {k: v for k, v in _code("x", FAILING, False).items() if k != "id"}},
             "agent": {"agent-000": {"actions": solving_actions(0)}, "agent-001": {"actions": [FINISH]}}}


def _raw(**changes: object) -> dict:
    raw = {"nonce": "n1",
           "code": [_code("humaneval-002", PASSING, True), _code("humaneval-000", FAILING, False)],
           "agent": [{"id": "agent-000", "actions": solving_actions(0), "success": True},
                     {"id": "agent-001", "actions": [FINISH], "success": False}]}
    raw.update(changes)
    return raw


def _judged(raw: dict) -> tuple[verdicts.Verdict, dict]:
    judge = ChallengeJudge(challenge=CHALLENGE, keys={}, reference=REFERENCE)
    v = verdicts.judge("eval", {"raw": raw, "passed": None}, context=verdicts.Context(challenge=judge))
    return v, judge.scores.get("eval", {})


def test_honest_answers_pass_with_the_portals_own_success() -> None:
    v, scores = _judged(_raw())
    assert v.status == "pass", v.reasons
    code, agent = scores["code"], scores["agent"]
    assert code["pass_at_1"] == {"reference": 0.5, "target": 0.5} and code["same_completions"] == 1.0
    assert [r["result_from"] for r in code["rows"]] == ["the reference run (identical completion)"] * 2
    assert agent["success"] == {"reference": 0.5, "target": 0.5} and agent["turn_agreement"] == 1.0
    # the reference's completions and actions never leave the portal
    assert "reference_sha256" not in str(scores) and all("completion" not in str(r.get("reference")) for r in
                                                          code["rows"])


def test_a_claimed_pass_of_a_reference_identical_failing_completion_is_a_dispute() -> None:
    v, scores = _judged(_raw(code=[_code("humaneval-002", PASSING, True), _code("humaneval-000", FAILING, True)]))
    assert v.status == "fail"
    assert any("code humaneval-000: the target's completion is claimed to pass, but the reference run ran the "
               "identical completion (same sha256) and it fails: a disputed item fails" in r for r in v.reasons), v.reasons
    row = next(r for r in scores["code"]["rows"] if r["id"] == "humaneval-000")
    assert (row["dispute"], row["claimed"], row["target"]) == (True, True, False)


def test_a_different_completion_keeps_the_agents_sandbox_result_and_says_so() -> None:
    other = "    return sorted(x for x in l if x > 0)\n"
    v, scores = _judged(_raw(code=[_code("humaneval-002", other, False), _code("humaneval-000", FAILING, False)]))
    assert v.status == "fail" and any("code humaneval pass@1 0 (2 problems) is below the reference's 0.5" in r
                                      for r in v.reasons), v.reasons
    assert scores["code"]["agents_word"] == ["humaneval-002"]
    assert PASSING not in str(scores) and REFERENCE["code"]["humaneval-002"]["sha256"] not in str(scores)
    assert any("1 of 2 completions differ from the reference's" in n for n in v.notes)


def test_actions_that_do_not_reach_the_goal_but_claim_success_fail() -> None:
    wrong = [json.dumps({"tool": "list", "args": {}}, sort_keys=True), FINISH]
    v, scores = _judged(_raw(agent=[{"id": "agent-000", "actions": wrong, "success": True},
                                    {"id": "agent-001", "actions": [FINISH], "success": False}]))
    assert v.status == "fail", v.reasons
    assert scores["agent"]["success"]["target"] == 0.0 and scores["agent"]["false_claims"] == ["agent-000"]
    assert any("agent_kv success 0 (2 episodes, replayed by the portal) is below the reference's 0.5" in r
               for r in v.reasons)
    assert any("success claimed for agent-000" in n for n in v.notes)


def test_turns_compare_tool_calls_and_lines_that_are_none_agree() -> None:
    listing = json.dumps({"tool": "list", "args": {}}, sort_keys=True)
    assert acting.turn_key('{"args": {}, "tool": "list"}') == acting.turn_key(listing)
    assert acting.turn_key("garbage a") == acting.turn_key("} other garbage") == "invalid"
    assert acting.turn_key(listing) != acting.turn_key(FINISH)
    ref = {"agent-000": {"actions": ["noise one", listing, FINISH]}, "agent-001": {"actions": [FINISH]}}
    scored = acting.score_agent(AGENT_ITEMS, {"agent-000": {"actions": ["noise two", listing, FINISH]},
                                              "agent-001": {"actions": [listing, FINISH]}}, ref)
    assert scored["turn_agreement"] == 3 / 5  # episode 0: 3 of 3 turns agree (the noise too); episode 1: 0 of 2


def test_actions_that_stop_before_finish_and_the_last_turn_do_not_succeed() -> None:
    episode = acting.replay(0, solving_actions(0)[:-1])  # the goal's store, but the episode never ended
    assert episode.truncated and not episode.success
    assert acting.replay(0, solving_actions(0)).success


@pytest.mark.parametrize(("raw", "phrase"), [
    (_raw(nonce="other"), "their nonce is not this attempt's"),
    (_raw(code=[_code("humaneval-002", PASSING, True),
                {**_code("humaneval-000", FAILING, False), "sha256": "0" * 64}]),
     "code humaneval-000: sha256 is not the sha256 of the completion as run"),
    (_raw(code=[_code("humaneval-002", PASSING, True), {**_code("humaneval-000", FAILING, False), "passed": "yes"}]),
     "code humaneval-000: passed must be true or false"),
    (_raw(code=[_code("humaneval-002", "x" * 20_000, True), _code("humaneval-000", FAILING, False)]),
     "code humaneval-002: completion must be a string of at most 16384 characters"),
    (_raw(agent=[{"id": "agent-000", "actions": [FINISH, FINISH]}, {"id": "agent-001", "actions": [FINISH]}]),
     "agent agent-000: action 2 comes after the episode ended at turn 1"),
    (_raw(agent=[{"id": "agent-000", "actions": ["a"] * (agent_env.MAX_TURNS + 1)},
                 {"id": "agent-001", "actions": [FINISH]}]),
     "agent agent-000: actions must be a list of at most 8 one-line strings"),
    (_raw(agent=[{"id": "agent-001", "actions": [FINISH]}]), "agent: 1 of 2 drawn items not answered (agent-000)"),
])
def test_malformed_or_forged_acting_answers_are_incomplete(raw: dict, phrase: str) -> None:
    v, _ = _judged(raw)
    assert v.status == "incomplete" and any(phrase in r for r in v.reasons), v.reasons


def test_the_stand_in_reference_passes_its_own_humaneval_completion() -> None:
    """The fixture's 'passing' completion really passes HumanEval/2's tests (checked with exec, no sandbox:
    the program is ours)."""
    problem = next(p for p in code_suite.problems() if p.task_id == "HumanEval/2")
    exec(compile(code_suite.program(problem, PASSING), "he2", "exec"), {})  # noqa: S102 - our own program
    with pytest.raises(AssertionError):
        exec(compile(code_suite.program(problem, FAILING), "he2", "exec"), {})  # noqa: S102
