"""The agent's side of portal-held references and challenges (docs/references.md) on a tiny Llama: the
``reference`` stage answers a hand-built pool with transformers fp32; a certify job's align and eval answer the
drawn items with the target (the runtime's engine, the served endpoint) and post raw outputs echoing the nonce;
a planted accuracy fault (a wrong rope theta in the target) makes those raw outputs differ from the reference's.

The model is the cached tiny Llama with its attention and its output sharpened (q and k projections × 6, the LM
head × 4): a random model's attention is nearly uniform, so a rope fault would move its log-likelihoods by only
about 0.01 and change no greedy token; sharpened, positions matter as in a trained model."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.pipeline.runner import run_pipeline
from agents.pipeline.stages.align.e2e import CHAT, PROMPTS, reference_greedy
from agents.pipeline.support.lm_backends import ReferenceLM, ServedLM
from agents.pipeline.support.models import encode, eos_token_ids, reference_model, tokenizer
from agents.pipeline.support.server_process import ServerProcess
from agents.runtime.loader import load_model
from agents.runtime.testing.make_model import cached_model
from contract.challenges import acting
from contract.challenges import pool as cp
from contract.suites import tasks as eval_tasks
from tests.pipeline.conftest import EventLog

KINDS = ("e2e", "mc", "qa", "ppl", "needle", "code", "agent")
NEEDLE = {"key": "apple", "value": "4821730", "distractors": [{"key": "pear", "value": "7654321"}]}


def suite_pool(limit: int = 3) -> dict[str, Any]:
    """A pool built by hand from the bundled suites, every item as the agent receives it."""
    pool: dict[str, Any] = {"version": "pool-v1", "top_k": 5}
    pool["e2e"] = [{"id": f"e2e-{i}", "prompt": p, "chat": c, "max_tokens": 8}
                   for i, (p, c) in enumerate(zip(PROMPTS, CHAT, strict=True))]
    task = eval_tasks.load_task("day0_mc")
    cfg = task.config
    pool["mc"] = [{"id": f"mc-{i}", "context": cfg.get("description", "") + eval_tasks.field_of(cfg["doc_to_text"], d),
                   "choices": [cfg.get("target_delimiter", " ") + str(c)
                               for c in eval_tasks.field_of(cfg["doc_to_choice"], d)]}
                  for i, d in enumerate(task.docs[:limit])]
    task = eval_tasks.load_task("day0_qa")
    cfg, gen = task.config, task.config["generation_kwargs"]
    pool["qa"] = [{"id": f"qa-{i}", "prompt": cfg.get("description", "") + eval_tasks.field_of(cfg["doc_to_text"], d),
                   "until": gen["until"], "max_tokens": gen["max_gen_toks"]} for i, d in enumerate(task.docs[:limit])]
    task = eval_tasks.load_task("day0_ppl")
    pool["ppl"] = [{"id": f"ppl-{i}", "text": eval_tasks.field_of(task.config["doc_to_target"], d)}
                   for i, d in enumerate(task.docs[:2])]
    pool["code"] = [{**item, "max_tokens": 24} for item in cp.pool().agent_items("code")[:2]]  # short: a tiny model
    pool["agent"] = cp.pool().agent_items("agent")[:2]
    pool["needle"] = [{"id": "needle-400-50-0", "length": 400, "depth": 50, **NEEDLE},
                      {"id": "needle-4096-0-0", "length": 4096, "depth": 0, **NEEDLE}]  # past the context of 1024
    return pool


def drawn(pool: dict[str, Any], kinds: tuple[str, ...], nonce: str) -> dict[str, Any]:
    """A challenge: every other item of each kind (the portal draws a secret sample)."""
    return {"nonce": nonce, "top_k": pool["top_k"], **{kind: pool[kind][::2] for kind in kinds}}


@pytest.fixture(scope="module")
def sharp_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with sharpened attention and output, saved like a hub repository (built once)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, out = cached_model("llama"), tmp_path_factory.mktemp("sharp-llama")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                param.mul_(6.0)
            elif "lm_head" in name:
                param.mul_(4.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    (out / "generation_config.json").write_text((source / "generation_config.json").read_text())
    return out


@pytest.fixture(scope="module")
def reference_section(sharp_llama: Path) -> dict[str, Any]:
    """The reference stage's section on the sharpened tiny Llama for ``suite_pool()`` (computed once)."""
    from agents.pipeline.support.context import StageContext

    path = sharp_llama
    torch.set_num_threads(1)
    log = EventLog()
    ctx = StageContext(model_dir=path, config=json.loads((path / "config.json").read_text()), hardware={"slug": "cpu"},
                       purpose="reference", nonce="ref-nonce", reference_pool=suite_pool(), emit_fn=log)
    report = run_pipeline(ctx, ["reference"])
    assert report["failed_stage"] is None, report["error"]
    assert report["verdicts"]["reference"]["status"] == "pass"
    progress = {e["data"]["what"] for e in log.events if e["kind"] == "progress"}
    assert {f"reference {kind}" for kind in KINDS} <= progress  # progress events per kind, as eval reports them
    return report["stages"]["reference"]


def _by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in rows}


def test_the_reference_stage_answers_every_pool_item_with_transformers_greedy(make_ctx, sharp_llama,
                                                                            reference_section) -> None:
    section, pool = reference_section, suite_pool()
    assert section["pool_version"] == "pool-v1" and section["nonce"] == "ref-nonce" and section["top_k"] == 5
    for kind in KINDS:
        assert [row["id"] for row in section[kind]] == [item["id"] for item in pool[kind]], kind
    ctx, _ = make_ctx(sharp_llama)
    ref, tok = reference_model(ctx), tokenizer(ctx)
    prompts, _ = encode(ctx, list(PROMPTS), chat=CHAT)
    eos = eos_token_ids(ctx)
    for row, prompt in zip(section["e2e"], prompts, strict=True):
        want, _ = reference_greedy(ref, prompt, 8, eos)  # transformers' own greedy decode, no cache
        assert row["tokens"] == want and row["prompt_tokens"] == len(prompt)
        assert len(row["top_logprobs"]) == len(row["tokens"])
        for token, top in zip(row["tokens"], row["top_logprobs"], strict=True):
            assert top[0]["token"] == token and len(top) == 5  # the chosen (greedy) token is the best of the five
            values = [e["logprob"] for e in top]
            assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
    assert section["e2e"][2]["prompt_tokens"] > len(tok(PROMPTS[2])["input_ids"])  # the chat template was applied
    for row, item in zip(section["mc"], pool["mc"], strict=True):
        assert len(row["loglikelihoods"]) == len(row["greedy"]) == len(item["choices"])
        assert all(ll < 0 for ll in row["loglikelihoods"])
    assert all(isinstance(row["text"], str) for row in section["qa"])
    for row, item in zip(section["ppl"], pool["ppl"], strict=True):
        assert row["tokens"] == len(tok(item["text"], add_special_tokens=False)["input_ids"]) and row["loglikelihood"] < 0
    fits, too_long = section["needle"]
    assert 300 < fits["prompt_tokens"] <= 400 and isinstance(fits["text"], str) and "error" not in fits
    assert too_long["text"] == "" and "does not fit the context of 1024" in too_long["error"]
    # greedy flags: the reference's own greedy continuation is greedy, another token is not
    lm = ReferenceLM(ref, tok)
    greedy = section["e2e"][0]["tokens"][:3]
    other = [(greedy[0] + 1) % 512]
    assert [g for _, g in lm.loglikelihood_greedy([(prompts[0], greedy), (prompts[0], other)])] == [True, False]


@pytest.mark.parametrize(("change", "match"), [
    (lambda p: p.pop("version"), r"reference_pool.version: must be the pool's version"),
    (lambda p: p["mc"][1].update(choices=["only one"]), r"reference_pool.mc\[1\].choices: must be a list of 2 to"),
    (lambda p: p["e2e"][0].update(max_tokens=0), r"reference_pool.e2e\[0\].max_tokens: must be an integer in \[1, "),
    (lambda p: p["qa"].append(dict(p["qa"][0])), r"reference_pool.qa: item id 'qa-0' appears more than once"),
    (lambda p: p["needle"][0]["distractors"].append("pear"), r"reference_pool.needle\[0\].distractors\[1\]: must be"),
    (lambda p: p.update(top_k=50), r"reference_pool.top_k: must be an integer in \[1, 20\]"),
])
def test_a_malformed_pool_fails_the_reference_stage_naming_the_path(make_ctx, change, match) -> None:
    pool = json.loads(json.dumps(suite_pool()))
    change(pool)
    ctx, _ = make_ctx("llama", reference_pool=pool)
    report = run_pipeline(ctx, ["reference"])  # the pool is checked before any model loads
    assert report["failed_stage"] == "reference"
    assert re.search(match, report["error"]), report["error"]
    ctx, _ = make_ctx("llama")
    assert "this job carries none" in run_pipeline(ctx, ["reference"])["error"]


def _target_with_rope(path: Path, tmp_path: Path, theta: float) -> Path:
    """A copy of ``path`` (links) whose config has another rope theta: the planted accuracy fault."""
    out = tmp_path / "wrong-rope"
    out.mkdir()
    for file in path.iterdir():
        if file.name != "config.json":
            (out / file.name).symlink_to(file)
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], "rope_theta": theta}
    (out / "config.json").write_text(json.dumps(config))
    return out


def _max_logprob_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(abs(x[0]["logprob"] - y[0]["logprob"]) for x, y in zip(a["top_logprobs"], b["top_logprobs"], strict=False))


def test_a_certify_align_posts_the_targets_raw_e2e_answers_for_the_drawn_items(make_ctx, sharp_llama,
                                                                              reference_section, tmp_path) -> None:
    challenge = drawn(suite_pool(), ("e2e",), "attempt-nonce")
    ctx, _ = make_ctx(sharp_llama, challenge=challenge, nonce="attempt-nonce")
    report = run_pipeline(ctx, ["load", "align"])
    align = report["stages"]["align"]
    assert report["failed_stage"] is None, report["error"]
    assert align["passed"] is True and align["e2e"]["passed"] is True and align["layers"]  # the rest as before
    raw = align["e2e"]["raw"]
    assert raw["nonce"] == "attempt-nonce" and raw["top_k"] == 5 and "engine" in raw["method"]
    assert [item["id"] for item in raw["items"]] == ["e2e-0", "e2e-2"]  # exactly the drawn ids
    reference = _by_id(reference_section["e2e"])
    for item in raw["items"]:
        ref = reference[item["id"]]
        assert item["tokens"] == ref["tokens"] and item["prompt_tokens"] == ref["prompt_tokens"]
        assert _max_logprob_diff(item, ref) < 1e-4  # fp32 on both sides
        assert all(top[0]["token"] == t for t, top in zip(item["tokens"], item["top_logprobs"], strict=True))

    # the planted fault: the target loads the weights with a wrong rope theta
    wrong = load_model(_target_with_rope(ctx.model_dir, tmp_path, 10.0), dtype="float32", device="cpu").model
    ctx, _ = make_ctx(sharp_llama, challenge={**challenge, "nonce": "attempt-2"}, nonce="attempt-2")
    ctx.state.model = wrong
    report = run_pipeline(ctx, ["align"])
    raw = report["stages"]["align"]["e2e"]["raw"]
    assert raw["nonce"] == "attempt-2" and [item["id"] for item in raw["items"]] == ["e2e-0", "e2e-2"]
    assert all(item["tokens"] != reference[item["id"]]["tokens"] for item in raw["items"])


def _eval_with_server(make_ctx: Any, model: Path, served: Path, tmp_path: Path, challenge: dict[str, Any]
                      ) -> tuple[Any, dict]:
    """The eval stage of a certify job on ``model`` whose served target is ``served`` (the same or a faulty copy)."""
    ctx, log = make_ctx(model, challenge=challenge, nonce=challenge["nonce"], workdir=tmp_path)
    server = ServerProcess(served, dtype="float32", device="cpu", tp=None, log_path=tmp_path / "serve.log")
    ctx.state.server = server
    server.wait_ready(120)
    report = run_pipeline(ctx, ["eval"])
    progress = {e["data"]["what"] for e in log.events if e["kind"] == "progress"}
    assert {f"eval challenge {kind}" for kind in challenge if kind in KINDS[1:]} <= progress
    return ctx, report


def test_a_certify_eval_posts_the_served_targets_raw_outputs_without_a_reference(make_ctx, sharp_llama,
                                                                                 reference_section, tmp_path) -> None:
    challenge = drawn(suite_pool(), ("mc", "qa", "ppl", "needle", "code", "agent"), "eval-nonce")
    ctx, report = _eval_with_server(make_ctx, sharp_llama, sharp_llama, tmp_path, challenge)
    assert report["failed_stage"] is None, report["error"]  # the agent cannot judge it: the portal does
    assert report["verdicts"]["eval"]["scored_by"] == "portal" and report["tier"] < 6
    section = report["stages"]["eval"]
    assert section["passed"] is None and section["scored_by"] == "portal" and "tasks" not in section
    assert ctx.state.reference_model is None and ctx.state.server is None  # no reference loaded; server stopped
    raw = section["raw"]
    assert raw["nonce"] == "eval-nonce"
    for kind in ("mc", "qa", "ppl", "needle"):
        assert [row["id"] for row in raw[kind]] == [item["id"] for item in challenge[kind]], kind
    ref = {kind: _by_id(reference_section[kind]) for kind in ("mc", "qa", "ppl", "needle")}
    for row in raw["mc"]:
        want = ref["mc"][row["id"]]
        assert row["loglikelihoods"] == pytest.approx(want["loglikelihoods"], abs=1e-3)
        assert row["greedy"] == want["greedy"]
    assert all(row["text"] == ref["qa"][row["id"]]["text"] for row in raw["qa"])
    for row in raw["ppl"]:
        assert row["tokens"] == ref["ppl"][row["id"]]["tokens"]
        assert row["loglikelihood"] == pytest.approx(ref["ppl"][row["id"]]["loglikelihood"], rel=1e-5)
    assert raw["needle"] == [ref["needle"]["needle-400-50-0"]]  # same prompt, same greedy answer
    # the acting items: the same greedy completion (by sha256) and sandbox result, the same actions turn by turn;
    # the portal's scoring takes the reference run's result for the identical completion and replays the actions
    ref_code, ref_agent = _by_id(reference_section["code"]), _by_id(reference_section["agent"])
    assert [row["id"] for row in raw["code"]] == ["humaneval-000"] and [r["id"] for r in raw["agent"]] == ["agent-000"]
    for row in raw["code"]:
        want = ref_code[row["id"]]
        assert (row["completion"], row["sha256"], row["passed"]) == (want["completion"], want["sha256"], want["passed"])
        assert row["status"] in ("passed", "failed", "timeout", "killed")
    code = acting.score_code(challenge["code"], _by_id(raw["code"]), ref_code)
    assert code["same_completions"] == 1.0 and not code["disputes"]
    # a random model's long transcripts meet near-ties (served runtime against transformers): the first turn agrees
    mine, theirs = raw["agent"][0]["actions"], ref_agent["agent-000"]["actions"]
    assert 1 <= len(mine) <= 8 and mine[0] == theirs[0]
    agent = acting.score_agent(challenge["agent"], _by_id(raw["agent"]), ref_agent)
    same = sum(acting.turn_key(a) == acting.turn_key(b) for a, b in zip(mine, theirs, strict=False))
    assert agent["turn_agreement"] == pytest.approx(same / max(len(mine), len(theirs)))
    assert agent["success"]["target"] == acting.replay(0, mine).success  # the portal's replay, not the claim


def test_the_served_greedy_flags_agree_with_the_reference(make_ctx, sharp_llama, tmp_path) -> None:
    ctx, _ = make_ctx(sharp_llama)
    tok = tokenizer(ctx)
    lm = ReferenceLM(reference_model(ctx), tok)
    prompt = list(tok("The harbour woke before the sun, and")["input_ids"])
    greedy = lm.greedy_top([prompt], [4], 5)[0]["tokens"]
    requests = [(prompt, greedy), (prompt, [(greedy[0] + 7) % 512]), (prompt, greedy[:1])]
    with ServerProcess(ctx.model_dir, dtype="float32", device="cpu", tp=None, log_path=tmp_path / "s.log") as server:
        server.wait_ready(120)
        served = ServedLM(server.url)
        try:
            got = served.loglikelihood_greedy(requests)
        finally:
            served.close()
    want = lm.loglikelihood_greedy(requests)
    assert [g for _, g in got] == [g for _, g in want] == [True, False, True]
    assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in want], abs=1e-4)


def test_a_wrong_rope_theta_in_the_served_target_changes_its_raw_eval_outputs(make_ctx, sharp_llama,
                                                                              reference_section, tmp_path) -> None:
    challenge = drawn(suite_pool(), ("mc", "ppl"), "fault-nonce")
    served = _target_with_rope(sharp_llama, tmp_path, 10.0)
    _, report = _eval_with_server(make_ctx, sharp_llama, served, tmp_path, challenge)
    raw = report["stages"]["eval"]["raw"]
    assert raw["nonce"] == "fault-nonce" and [row["id"] for row in raw["mc"]] == ["mc-0", "mc-2"]
    ref_mc, ref_ppl = _by_id(reference_section["mc"]), _by_id(reference_section["ppl"])
    mc_diff = max(abs(a - b) for row in raw["mc"]
                  for a, b in zip(row["loglikelihoods"], ref_mc[row["id"]]["loglikelihoods"], strict=True))
    ppl_diff = max(abs(row["loglikelihood"] - ref_ppl[row["id"]]["loglikelihood"]) for row in raw["ppl"])
    assert mc_diff > 0.1 and ppl_diff > 1.0, (mc_diff, ppl_diff)  # fp32 agreement is within 1e-3 (above)


def test_a_needle_with_given_keys_and_values_hides_exactly_them() -> None:
    from contract.suites import needle as eval_needle

    def count(text: str) -> int:
        return len(text.split())

    needle = ("apple", "4821730", [("pear", "7654321"), ("plum", "1112223")])
    item = eval_needle.build_item(count, 400, 75, seed="needle-400-75-0", needle=needle)
    assert item.key == "apple" and item.value == "4821730" and item.distractors == ("7654321", "1112223")
    assert 380 <= item.tokens <= 400 and item.prompt.endswith(eval_needle.QUESTION.format(key="apple"))
    for key, value in (("apple", "4821730"), ("pear", "7654321"), ("plum", "1112223")):
        assert item.prompt.count(eval_needle.NEEDLE.format(key=key, value=value)) == 1
    body = item.prompt[len(eval_needle.HEADER): item.prompt.index("\nWhat is the special")]
    assert abs(body.index("for apple is") / len(body) - 0.75) < 0.15  # at its depth
    assert eval_needle.build_item(count, 400, 75, seed="needle-400-75-0", needle=needle) == item  # deterministic
    assert eval_needle.build_item(count, 400, 75, seed="another-id", needle=needle).prompt != item.prompt
