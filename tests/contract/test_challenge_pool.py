"""The challenge pool (contract/challenges/pool.py): items rendered as the harness renders the suites,
agent-facing items without answers, a version that follows the content, fresh needles."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from contract.challenges import pool as cp
from contract.suites import agent_env
from contract.suites import humaneval as code_suite
from contract.suites import tasks as eval_tasks


def test_pool_items_render_as_the_harness_does() -> None:
    pool = cp.pool()
    assert {k: len(v) for k, v in pool.items.items()} == {"e2e": 48, "mc": 231, "qa": 72, "ppl": 8,
                                                          "code": cp.CODE_POOL, "agent": cp.AGENT_POOL}
    mc = pool.items["mc"]["mc-000"]
    assert mc == {"id": "mc-000", "context": "Question: What is the capital of France?\nAnswer:",
                  "choices": [" Paris", " Lyon", " Madrid", " Berlin"]}
    # the context / continuation split an agent makes is the harness's own, e.g. with a character tokenizer
    encode = lambda s: [ord(c) for c in s]  # noqa: E731
    assert eval_tasks.encode_pair(encode, mc["context"], mc["choices"][0])[1] == encode(" Paris")
    qa = pool.items["qa"]["qa-000"]
    assert qa["prompt"].startswith("Answer each question with one or two words.\n\n")
    assert qa["prompt"].endswith("Question: What is the capital of France?\nAnswer:")
    assert (qa["until"], qa["max_tokens"]) == (["\n"], 12)
    assert pool.items["e2e"]["e2e-002"] == {"id": "e2e-002", "prompt": "Write one sentence about rivers.",
                                            "chat": True, "max_tokens": cp.E2E_MAX_TOKENS}


def test_code_and_agent_items_are_humaneval_problems_and_agent_seeds() -> None:
    pool = cp.pool()
    first = code_suite.problems()[0]
    assert pool.items["code"]["humaneval-000"] == {"id": "humaneval-000", "task_id": "HumanEval/0",
                                                   "prompt": first.prompt, "stop": list(code_suite.STOP),
                                                   "max_tokens": code_suite.MAX_TOKENS}
    assert [pool.items["code"][i]["task_id"] for i in pool.ids("code")] == [
        f"HumanEval/{n}" for n in range(cp.CODE_POOL)]
    assert "test" not in pool.items["code"]["humaneval-000"]  # the package ships the tests; the item names them
    assert pool.items["agent"]["agent-005"] == {"id": "agent-005", "seed": 5, "max_turns": agent_env.MAX_TURNS,
                                                "max_tokens": agent_env.ACTION_MAX_TOKENS}
    assert [pool.items["agent"][i]["seed"] for i in pool.ids("agent")] == list(range(cp.AGENT_POOL))


def test_answers_stay_out_of_agent_items() -> None:
    pool = cp.pool()
    assert pool.answers["mc"]["mc-000"]["answer"] == 0 and pool.answers["qa"]["qa-000"]["answer"] == "Paris"
    assert pool.answers["ppl"]["ppl-000"]["words"] > 50
    for kind in cp.POOL_KINDS:
        for item in pool.agent_items(kind):
            assert not {"answer", "options", "words"} & set(item)
    shipped = cp.reference_pool(pool, cp.needle_items([256], [50]))
    assert shipped["pool_version"] == pool.version and len(shipped["mc"]) == 231
    assert "Paris" not in str(shipped["qa"][0]["prompt"].rsplit("\n\n", 1)[-1])


def test_version_is_the_sha256_of_the_canonical_content() -> None:
    pool = cp.build_pool()
    body = {kind: [{"item": pool.items[kind][i], "answer": pool.answers[kind][i]} for i in pool.ids(kind)]
            for kind in cp.POOL_KINDS}
    assert pool.version == hashlib.sha256(cp.canonical(body).encode()).hexdigest()
    assert cp.build_pool().version == pool.version  # deterministic


def test_needles_are_fresh_and_distinct() -> None:
    first, second = cp.needle_items([256, 512], [0, 50, 100]), cp.needle_items([256, 512], [0, 50, 100])
    assert [n["id"] for n in first] == [f"needle-{n}-{d}-0" for n in (256, 512) for d in (0, 50, 100)]
    assert [n["value"] for n in first] != [n["value"] for n in second]
    for item in first:
        values = [item["value"], *(d["value"] for d in item["distractors"])]
        keys = [item["key"], *(d["key"] for d in item["distractors"])]
        assert len(set(values)) == len(values) == 4 and len(set(keys)) == 4
        assert all(len(v) == 7 and v.isdigit() for v in values)
    assert cp.needle_answers(first)["needle-512-50-0"] == {"value": first[4]["value"], "length": 512}
    assert cp.needle_lengths(2048) == [256, 512, 1024] and cp.needle_lengths(300) == [256, 288]


def test_pool_and_scoring_import_neither_torch_nor_django() -> None:
    code = ("import sys; import contract.challenges.pool as p, contract.challenges.verdicts; "
            "p.pool(); assert not {'torch', 'django'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
