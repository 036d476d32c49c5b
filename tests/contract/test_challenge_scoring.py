"""The portal's scoring of raw outputs (contract/challenges/scoring.py and verdicts.py), with
numbers computed by hand: the power rule, Wilson bounds, first divergence with the mutual top-k rule, the
checks that raw outputs answer exactly the drawn challenge, and the verdicts built from them."""

from __future__ import annotations

import math

import pytest

from contract import thresholds as th
from contract import verdicts
from contract.challenges import scoring as cs
from contract.challenges.verdicts import ChallengeJudge


def test_sample_size_follows_the_power_rule() -> None:
    # p0 = 0.5, theta = 0.1: ((1.64485 * 0.5 + 0.84162 * sqrt(0.4 * 0.6)) / 0.1)^2 = 12.3473^2 = 152.46 -> 153
    size = cs.sample_size(0.5, 0.1, 0.05, 0.2, pool=231)
    assert (size["n"], size["wanted"], size["capped"], size["p1"]) == (153, 153, False, pytest.approx(0.4))
    # p0 = 0.9: ((1.64485 * 0.3 + 0.84162 * 0.4) / 0.1)^2 = 8.30104^2 = 68.91 -> 69; a pool of 50 caps it
    assert cs.sample_size(0.9, 0.1, 0.05, 0.2, pool=72)["n"] == 69
    capped = cs.sample_size(0.9, 0.1, 0.05, 0.2, pool=50)
    assert (capped["n"], capped["wanted"], capped["capped"]) == (50, 69, True)
    with pytest.raises(ValueError, match="theta"):
        cs.sample_size(0.5, 0.0, 0.05, 0.2, pool=10)


def test_wilson_interval_by_hand() -> None:
    # 8 of 10: centre 0.8 + z²/20 = 0.992073, margin z·sqrt(0.016 + z²/400) = 0.313616, over 1 + z²/10 = 1.384146
    low, high = cs.wilson(8, 10)
    assert low == pytest.approx(0.49016, abs=1e-4) and high == pytest.approx(0.94332, abs=1e-4)
    assert cs.wilson(0, 0) == (0.0, 1.0)


def _top(*pairs: tuple[int, float]) -> list[dict]:
    return [{"token": t, "logprob": lp} for t, lp in pairs]


REF = {"tokens": [1, 2, 3, 4],
       "top_logprobs": [_top((1, -0.1), (5, -2.0)), _top((2, -0.2), (6, -3.0)), _top((3, -0.69), (9, -0.70)),
                        _top((4, -0.3))]}


def test_a_near_tie_ends_the_comparison_and_counts_the_matched_tokens() -> None:
    target = {"tokens": [1, 2, 9, 7],
              "top_logprobs": [_top((1, -0.15)), _top((2, -0.2)), _top((9, -0.68), (3, -0.71)), _top((7, -0.1))]}
    row = cs.compare_e2e(REF, target, k=5)
    assert (row["outcome"], row["compared"], row["matched"], row["position"]) == ("near-tie", 3, 2, 2)
    assert row["logprob_diffs"] == pytest.approx([0.05, 0.0])  # |−0.15 − (−0.1)|, |−0.2 − (−0.2)|; none past it


def test_a_divergence_outside_the_top_k_is_hard_and_a_short_target_fails() -> None:
    target = {"tokens": [1, 8], "top_logprobs": [_top((1, -0.1)), _top((8, -0.5), (2, -0.6))]}
    row = cs.compare_e2e(REF, target, k=5)  # 8 is not in the reference's top list at position 1
    assert (row["outcome"], row["position"], row["ref_token"], row["target_token"]) == ("diverged", 1, 2, 8)
    short = cs.compare_e2e(REF, {"tokens": [1, 2], "top_logprobs": REF["top_logprobs"][:2]}, k=5)
    assert (short["outcome"], short["compared"], short["matched"]) == ("short", 4, 2)


def test_token_match_rate_over_the_sample() -> None:
    drawn = [{"id": "e2e-000", "prompt": "a"}, {"id": "e2e-001", "prompt": "b"}]
    reference = {"e2e-000": REF, "e2e-001": REF}
    answers = {"e2e-000": REF, "e2e-001": {"tokens": [1, 2, 9, 4], "top_logprobs": [
        _top((1, -0.1)), _top((2, -0.2)), _top((9, -0.6), (3, -0.7)), _top((4, -0.3))]}}
    score = cs.score_e2e(drawn, answers, reference, k=5)
    # 4 of 4 on the first prompt, 2 of 3 on the second (compared up to and including the near-tie)
    assert (score["matched"], score["compared"]) == (6, 7)
    assert score["token_match_rate"] == pytest.approx(6 / 7) and score["hard"] == [] and score["near_ties"] == 1


def test_top_k_takes_the_k_most_likely_even_with_the_chosen_token_first() -> None:
    top = _top((9, -4.0), (1, -0.1), (2, -0.5), (3, -1.0))  # the chosen token 9, listed first, is fourth
    assert cs.top_ids(top, 3) == {1, 2, 3}


def test_exclusive_choices_cannot_sum_past_one() -> None:
    assert cs.excess_probability([" a", " b"], [0.0, 0.0]) == pytest.approx(2.0)
    assert cs.excess_probability([" a", " b"], [math.log(0.5), math.log(0.25)]) == pytest.approx(0.75)
    assert cs.excess_probability([" a", " ab"], [0.0, 0.0]) is None  # one continues the other


def test_check_raw_names_unknown_missing_twice_and_malformed() -> None:
    drawn = [{"id": "mc-001", "choices": [" a", " b"]}, {"id": "mc-002", "choices": [" a", " b"]},
             {"id": "mc-003", "choices": [" a", " b"]}]
    raw = [{"id": "mc-001", "loglikelihoods": [-1.0, -2.0]}, {"id": "mc-001", "loglikelihoods": [-1.0, -2.0]},
           {"id": "mc-009", "loglikelihoods": [-1.0, -2.0]}, {"id": "mc-002", "loglikelihoods": [-1.0]}]
    by_id, problems = cs.check_raw("mc", raw, drawn, top_k=5)
    assert set(by_id) == {"mc-001", "mc-002"}
    text = " | ".join(problems)
    assert "1 answer(s) to items that were not drawn (mc-009)" in text
    assert "answered twice (mc-001)" in text
    assert "1 of 3 drawn items not answered (mc-003)" in text
    assert "mc-002: loglikelihoods must be 2 numbers <= 0" in text
    assert cs.check_raw("mc", None, drawn, 5)[1] == ["mc raw outputs missing (a list of answers, one per drawn item)"]
    e2e = [{"id": "e2e-000", "max_tokens": 2}]
    _, long = cs.check_raw("e2e", [{"id": "e2e-000", "tokens": [1, 2, 3], "top_logprobs": [[], [], []]}], e2e, 5)
    assert "tokens must be a list of at most 2 token ids" in long[0]


def test_qa_and_needle_match_as_the_tasks_score() -> None:
    options = {"ignore_case": True, "ignore_punctuation": True, "regexes_to_ignore": ["^(?:[Tt]he|[Aa]n?) "]}
    assert cs.qa_correct(" The Paris.\nQuestion: next", ["\n"], "paris", options)
    assert not cs.qa_correct(" Lyon", ["\n"], "Paris", options)
    assert cs.needle_correct(" is 1234567, not 7654321", "1234567")
    assert not cs.needle_correct(" is 7654321", "1234567")


# --- the verdicts the portal builds from them ---------------------------------------------------------------------

CHALLENGE = {"nonce": "n1", "top_k": 5, "e2e": [{"id": "e2e-000", "prompt": "a", "chat": False, "max_tokens": 4}],
             "mc": [{"id": "mc-001", "context": "Q", "choices": [" a", " b"]},
                    {"id": "mc-002", "context": "Q", "choices": [" a", " b"]}],
             "ppl": [{"id": "ppl-000", "text": "one two three four"}]}
KEYS = {"mc": {"mc-001": {"answer": 0}, "mc-002": {"answer": 1}}, "ppl": {"ppl-000": {"words": 4}}}
REFERENCE = {"e2e": {"e2e-000": REF},
             "mc": {"mc-001": {"loglikelihoods": [-0.5, -2.0]}, "mc-002": {"loglikelihoods": [-3.0, -0.2]}},
             "ppl": {"ppl-000": {"loglikelihood": -8.0, "tokens": 5}}}


def _judge(reference: dict | None = REFERENCE) -> ChallengeJudge:
    return ChallengeJudge(challenge=CHALLENGE, keys=KEYS, reference=reference)


def _eval_raw(**changes: object) -> dict:
    raw = {"nonce": "n1", "mc": [{"id": "mc-001", "loglikelihoods": [-0.6, -2.1]},
                                 {"id": "mc-002", "loglikelihoods": [-3.1, -0.25]}],
           "ppl": [{"id": "ppl-000", "loglikelihood": -8.1, "tokens": 5}]}
    raw.update(changes)
    return raw


def test_eval_judged_from_the_portal_scores() -> None:
    judge = _judge()
    v = verdicts.judge("eval", {"raw": _eval_raw(), "tasks": [], "passed": True}, context=verdicts.Context(
        challenge=judge))
    assert v.status == "pass", v.reasons
    scores = judge.scores["eval"]
    assert scores["mc"]["target"]["accuracy"] == 1.0 and scores["mc"]["reference"]["accuracy"] == 1.0
    # exp(8.1 / 4) = 7.5773 and exp(8 / 4) = 7.3891: 2.5 % apart, within 5 %
    assert scores["ppl"]["target"] == pytest.approx(math.exp(8.1 / 4))


@pytest.mark.parametrize(("raw", "status", "phrase"), [
    (None, "incomplete", "eval: raw outputs missing"),
    ({"nonce": "n1"}, "incomplete", "eval: mc raw outputs missing"),
    (_eval_raw(nonce="other"), "incomplete", "their nonce is not this attempt's"),
    (_eval_raw(mc=[{"id": "mc-001", "loglikelihoods": [-0.6, -2.1]}]), "incomplete",
     "mc: 1 of 2 drawn items not answered (mc-002)"),
    (_eval_raw(mc=[{"id": "mc-001", "loglikelihoods": [0.0, 0.0]}, {"id": "mc-002", "loglikelihoods": [0.0, 0.0]}]),
     "fail", "sum past 1: these are not log-likelihoods"),
    (_eval_raw(mc=[{"id": "mc-001", "loglikelihoods": [-3.0, -0.1]}, {"id": "mc-002", "loglikelihoods": [-3.0, -0.1]}]),
     "fail", "mc accuracy 0.5000 (1/2"),
    (_eval_raw(ppl=[{"id": "ppl-000", "loglikelihood": 0.0, "tokens": 5}]), "fail",
     "cannot be this much better"),
])
def test_forged_eval_raw_outputs(raw: dict | None, status: str, phrase: str) -> None:
    section = {"tasks": [{"task": "mmlu", "metric": "acc", "reference": 0, "target": 0, "n": 0}], "passed": True}
    if raw is not None:
        section["raw"] = raw
    v = verdicts.judge("eval", section, context=verdicts.Context(challenge=_judge()))
    assert v.status == status and any(phrase in r for r in v.reasons), v.reasons


def test_awaiting_reference_is_incomplete_and_standalone_judges_its_own_numbers() -> None:
    v = verdicts.judge("eval", {"raw": _eval_raw()}, context=verdicts.Context(challenge=_judge(reference=None)))
    assert v.status == "incomplete"
    assert v.reasons == ["eval: awaiting reference: the release has no finished reference run"]
    own = verdicts.judge("eval", {"tasks": [{"task": "x", "metric": "acc", "reference": 0.5, "target": 0.5}],
                                  "needle": {"lengths": [256], "reference": [[1.0]], "target": [[1.0]]}})
    assert own.passed and "eval: judged from the agent's own numbers: no portal reference" in own.notes


def _judge_scores(raw: dict) -> dict:
    judge = _judge()
    judge(verdicts.Verdict("align"), "align", {"e2e": {"raw": raw}}, th.merged(None))
    return judge.scores


def test_align_e2e_from_the_portal_scores() -> None:
    raw = {"nonce": "n1", "items": [{"id": "e2e-000", **REF}]}
    judge = _judge()
    v = verdicts.Verdict("align")
    judge(v, "align", {"e2e": {"raw": raw, "token_match_rate": 0.0}}, th.merged(None))
    assert v.status == "pass" and judge.scores["align"]["e2e"]["token_match_rate"] == 1.0
    wrong = {"nonce": "n1", "items": [{"id": "e2e-000", "tokens": [7, 7, 7, 7],
                                       "top_logprobs": [_top((7, -0.1))] * 4}]}
    v = verdicts.Verdict("align")
    _judge()(v, "align", {"e2e": {"raw": wrong}}, th.merged(None))
    assert v.status == "fail"
    assert any("e2e prompt e2e-000 ('a') position 0: target token 7 and the reference's differ beyond a near-tie"
               in r for r in v.reasons)
    assert not any("reference 1" in r or "token 1 " in r for r in v.reasons)  # the reference's token 1 is unnamed
    assert "ref_token" not in str(_judge_scores(wrong))
    assert any("token match rate 0.0000 (0 of 1 tokens) is below 0.9" in r for r in v.reasons)
