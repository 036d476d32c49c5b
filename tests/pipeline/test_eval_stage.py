"""The eval stage's suites and scoring (no model), and its option checks. The stage on the real model through
a served endpoint is in test_real_model_eval.py."""

from __future__ import annotations

import collections
import math

import pytest
import yaml

from agents.pipeline.stages.eval import stage as eval_stage
from agents.pipeline.support.errors import StageFailed
from contract.suites import needle as eval_needle
from contract.suites import tasks as eval_tasks


def _words(text: str) -> list[int]:
    """A stand-in tokenizer: one id per whitespace-separated word (the needle only needs a token count)."""
    return [hash(w) % 1000 for w in text.split()]


def test_multiple_choice_suite_has_200_plus_distinct_items_with_balanced_answer_positions() -> None:
    task = eval_tasks.load_task("day0_mc")
    assert len(task.docs) >= 200
    assert len({d["question"] for d in task.docs}) == len(task.docs)
    for doc in task.docs:
        assert len(doc["choices"]) == 4 and len(set(doc["choices"])) == 4, doc
    positions = collections.Counter(d["answer"] for d in task.docs)
    assert set(positions) == {0, 1, 2, 3} and max(positions.values()) - min(positions.values()) <= 1
    # every prefix of the suite (what eval_limit takes) stays balanced too
    first = collections.Counter(d["answer"] for d in task.docs[:8])
    assert set(first.values()) == {2}


def test_suite_files_are_lm_eval_tasks_pointing_at_their_data() -> None:
    for name, filename in eval_tasks.TASK_FILES.items():
        config = yaml.safe_load((eval_tasks.SUITES_DIR / filename).read_text())
        assert config["task"] == name and config["dataset_path"] == "json"
        data = config["dataset_kwargs"]["data_files"][config["test_split"]]
        assert data.startswith("contract/suites/") and (eval_tasks.SUITES_DIR.parents[1] / data).is_file()
        assert config["output_type"] in eval_tasks.OUTPUT_TYPES and config["metric_list"][0]["metric"]


def test_requests_follow_the_harness_context_continuation_split() -> None:
    task = eval_tasks.load_task("day0_mc")
    req = eval_tasks.build_requests(task, _encode_chars, limit=2)
    assert len(req.loglikelihood) == 8 and req.owners == [0, 0, 0, 0, 1, 1, 1, 1]
    context, continuation = req.loglikelihood[0]
    assert _decode_chars(context) == "Question: What is the capital of France?\nAnswer:"
    assert _decode_chars(continuation) == " " + task.docs[0]["choices"][0]
    # a trailing space of the context moves to the continuation
    assert eval_tasks.encode_pair(_encode_chars, "Answer: ", "Paris") == (_encode_chars("Answer:"),
                                                                         _encode_chars(" Paris"))


def _encode_chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def _decode_chars(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def test_scores_multiple_choice_exact_match_and_word_perplexity() -> None:
    mc = eval_tasks.build_requests(eval_tasks.load_task("day0_mc"), _encode_chars, limit=2)
    # doc 0's right answer is choice 0, doc 1's is choice 1: pick choice 0 both times -> half right
    score = eval_tasks.score(mc, loglikelihoods=[-1, -2, -3, -4, -1, -2, -3, -4])
    assert score.value == 0.5 and score.correct == [True, False] and score.answers == [0, 0]

    qa = eval_tasks.build_requests(eval_tasks.load_task("day0_qa"), _encode_chars, limit=3)
    assert qa.until == ["\n"] and qa.max_tokens == 12
    assert _decode_chars(qa.prompts[0]).startswith("Answer each question") and qa.prompts[0][-7:] == _encode_chars(
        "Answer:")
    score = eval_tasks.score(qa, generations=[" paris.", " The Rome\nQuestion: x", " Kyoto"])
    assert score.correct == [True, True, False] and score.answers[1] == "The Rome"

    ppl = eval_tasks.build_requests(eval_tasks.load_task("day0_ppl"), _encode_chars, limit=1, max_length=101,
                                    prefix_token=1)
    text = eval_tasks.load_task("day0_ppl").docs[0]["text"]
    assert len(ppl.loglikelihood) == math.ceil(len(text) / 100)  # disjoint windows of 100 predicted tokens
    assert ppl.loglikelihood[0][0] == [1] and ppl.loglikelihood[1][0] == [ord(text[99])]
    assert sum(len(c) for _, c in ppl.loglikelihood) == len(text)
    score = eval_tasks.score(ppl, loglikelihoods=[-2.0] * len(ppl.loglikelihood))
    assert score.value == pytest.approx(math.exp(2.0 * len(ppl.loglikelihood) / ppl.words[0]))


def test_wilson_lower_bound() -> None:
    assert eval_tasks.wilson_low(0, 10) == 0.0
    assert eval_tasks.wilson_low(50, 100) == pytest.approx(0.4038, abs=1e-4)
    assert eval_tasks.wilson_low(10, 10) == pytest.approx(0.7225, abs=1e-4)


@pytest.mark.parametrize("depth", [0, 50, 100])
def test_needle_prompts_fill_their_length_with_the_needle_at_its_depth_and_distractors(depth: int) -> None:
    def count(text: str) -> int:
        return len(_words(text))

    item = eval_needle.build_item(count, 400, depth, distractors=3)
    assert 380 <= item.tokens <= 400 and item.tokens == count(item.prompt)
    needle = eval_needle.NEEDLE.format(key=item.key, value=item.value)
    assert item.prompt.count(needle) == 1 and len(set(item.distractors) | {item.value}) == 4
    body = item.prompt[len(eval_needle.HEADER) : item.prompt.index("\nWhat is the special")]
    where = body.index(needle) / len(body)
    assert abs(where - depth / 100) < 0.15, where
    assert all(d in body for d in item.distractors)
    assert eval_needle.is_correct(item, f" {item.value}.") and not eval_needle.is_correct(item, item.distractors[0])
    assert not eval_needle.is_correct(item, "I do not know")
    assert eval_needle.build_item(count, 400, depth, distractors=3) == item  # deterministic


def test_needle_grid_and_lm_eval_export(tmp_path) -> None:
    items = eval_needle.build_items(lambda t: len(_words(t)), [128, 256], [0, 100], samples=2, distractors=1)
    correct = [True, False, True, True, False, False, True, True]
    assert eval_needle.accuracy_grid(items, correct, [128, 256], [0, 100]) == [[0.5, 1.0], [0.0, 1.0]]
    path = eval_needle.write_lm_eval_task(items, tmp_path, 12)
    config = yaml.safe_load(path.read_text())
    assert config["task"] == "day0_needle" and config["filter_list"][0]["filter"][0]["regex_pattern"] == r"(\d{7})"
    assert len((tmp_path / "day0_needle.jsonl").read_text().splitlines()) == 8
    with pytest.raises(ValueError, match="too short"):
        eval_needle.build_item(lambda t: len(_words(t)), 20, 0)


def test_options_name_what_is_wrong(make_ctx) -> None:
    ctx, _ = make_ctx("llama")
    assert eval_stage.options(ctx, 2048)["needle_lengths"] == [256, 512, 1024]
    assert eval_stage.options(ctx, 600)["needle_lengths"] == [256, 512, 588]  # up to the served context
    for bench, match in (
        ({"eval_tasks": ["day0_mc", "trivia"]}, "eval_tasks"),
        ({"eval_limit": 0}, r"eval_limit: 0 is not an integer in \[1, 100000\]"),
        ({"eval_needle_depths": [0, 150]}, "eval_needle_depths"),
        ({"eval_needle_lengths": [256, 4096]}, "do not fit the served context of 2048"),
        ({"eval_needle_samples": "3"}, "eval_needle_samples"),
    ):
        ctx.bench = bench
        with pytest.raises(StageFailed, match=match):
            eval_stage.options(ctx, 2048)


def test_task_rows_are_one_sided() -> None:
    row = eval_stage.task_row("t", "acc", 0.5, 0.6, n=10, rtol=0.05, higher_is_better=True, chance=0.25,
                              correct=([True] * 5 + [False] * 5, [True] * 6 + [False] * 4))
    assert row["passed"] and row["wilson_low"] == pytest.approx(eval_tasks.wilson_low(6, 10))
    assert not eval_stage.task_row("t", "acc", 0.5, 0.47, n=10, rtol=0.05, higher_is_better=True, chance=None,
                                   correct=None)["passed"]
    assert eval_stage.task_row("p", "word_perplexity", 10.0, 10.4, n=3, rtol=0.05, higher_is_better=False,
                               chance=None, correct=None)["passed"]
    assert not eval_stage.task_row("p", "word_perplexity", 10.0, 10.6, n=3, rtol=0.05, higher_is_better=False,
                                   chance=None, correct=None)["passed"]
