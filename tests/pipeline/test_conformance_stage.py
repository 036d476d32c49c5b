"""The ``conformance`` stage against the real bundled server (in this process, on a tiny random-weight model
whose template declares tools, tests/runtime/tool_models.py): it passes on a correct server, and fails naming
the check on one with a planted parser fault (tool calls dropped when streamed) and on one that miscounts
``usage.prompt_tokens``. A random model cannot be sampled into a tool call, so both sides are scripted: the
engine through ``ForcedOutput``'s hook (per request: a call where tools are offered, JSON where a schema
constrains, prose otherwise) and the transformers reference through its logits (the same call)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from agents.pipeline.stages.conformance import stage as conformance
from agents.runtime.engine import LLMEngine
from agents.runtime.server import chat_output, create_app, render
from agents.runtime.server.launcher import ServerThread
from contract import verdicts
from tests.runtime.tool_models import ForcedOutput, tool_model

CALL = '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n</tool_call>'
JSON = '{"city":"Paris","answer":"sunny and warm"}'  # compact: the grammar allows no optional whitespace
PROSE = "The moon is bright tonight and the sea is calm."


class ScriptedEngine(ForcedOutput):
    """``ForcedOutput`` with the script chosen per sequence from its request: a call, JSON or prose."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        tok = engine.tokenizer
        self.scripts = {k: tok.encode(v, add_special_tokens=False) for k, v in
                        (("call", CALL), ("json", JSON), ("prose", PROSE))}
        run = engine.runner.run_step

        def step(batch):
            out = run(batch)  # ForcedOutput's step with no script: the model's own logits
            if out.logits is None:
                return out
            eos = min(engine.eos_token_ids)
            logits = torch.full_like(out.logits, float("-inf"))
            for row, seq in enumerate(out.seqs):
                prompt = tok.decode(seq.prompt_token_ids, skip_special_tokens=False)
                script = self.scripts["call" if "<tools>" in prompt else "json" if seq.matcher is not None
                                      else "prose"]
                k = seq.num_output_tokens
                logits[row, script[k] if k < len(script) else eos] = 0.0
            out.logits = logits
            return out

        engine.runner.run_step = step


class ScriptedReference:
    """The transformers reference model answering the call's tokens greedily, then EOS (its forward still runs)."""

    def __init__(self, model, script: list[int], eos: int) -> None:
        self.model, self.script, self.eos, self.k = model, script, eos, 0

    def __call__(self, input_ids, **kwargs):
        out = self.model(input_ids=input_ids, **kwargs)
        cached = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5.2x names it ``cache``
        self.k = 0 if cached is None else self.k + 1
        logits = torch.full_like(out.logits, float("-inf"))
        logits[0, -1, self.script[self.k] if self.k < len(self.script) else self.eos] = 0.0
        out.logits = logits
        return out


@pytest.fixture(scope="module")
def served():
    engine = LLMEngine(tool_model("hermes"), num_blocks=128, max_pending=16)
    ScriptedEngine(engine)
    hf = AutoModelForCausalLM.from_pretrained(tool_model("hermes"), dtype=torch.float32).eval()  # the stage's own
    with ServerThread(create_app(engine, "tiny")) as url:
        yield url, engine, hf


def _run(make_ctx, served) -> dict:
    url, engine, hf = served
    ctx, _log = make_ctx(tool_model("hermes"))
    ctx.state.server = SimpleNamespace(url=url)  # the server a serve stage leaves up: only its URL is read
    ctx.state.reference_model = ScriptedReference(hf, engine.tokenizer.encode(CALL, add_special_tokens=False),
                                                  min(engine.eos_token_ids))
    return conformance.run(ctx)


def _rows(section: dict) -> dict[str, dict]:
    return {r["check"]: r for r in section["checks"]}


def test_a_correct_server_passes_every_check(make_ctx, served):
    section = _run(make_ctx, served)
    rows = _rows(section)
    assert section["template_declares_tools"] is True and section["thinking"] is True
    assert section["tool_call_parser"] == "hermes"
    assert {r["check"]: r["passed"] for r in section["checks"]} == dict.fromkeys(rows, True), section["checks"]
    assert set(rows) >= {"tool_trigger_agreement", "tool_arguments_valid", "forced_calls_valid", "json_schema_valid",
                         "stream_equals_whole", "prompt_tokens", "stop_honoured", "n_honoured", "seed_determinism",
                         "max_tokens_honoured", "error_shape", "reasoning_not_in_content"}
    assert rows["tool_trigger_agreement"]["target"] == rows["tool_trigger_agreement"]["reference"] == [True] * 4
    assert rows["stop_honoured"]["target"][0] == rows["stop_honoured"]["reference"][0] != PROSE
    verdict = verdicts.judge("conformance", section)
    assert verdict.passed, verdict.reasons


def test_a_tool_call_dropped_when_streamed_fails_naming_the_check(make_ctx, served, monkeypatch):
    finish = chat_output.StreamedChoice.finish

    def dropping(self, new_text):
        deltas, msg = finish(self, new_text)
        return [d for d in deltas if "tool_calls" not in d], msg

    monkeypatch.setattr(chat_output.StreamedChoice, "finish", dropping)
    section = _run(make_ctx, served)
    failed = {r["check"] for r in section["checks"] if not r["passed"]}
    assert failed == {"stream_equals_whole"}, section["checks"]
    verdict = verdicts.judge("conformance", section)
    assert not verdict.passed and any("stream_equals_whole" in r for r in verdict.reasons)


def test_a_miscounted_prompt_fails_naming_the_check(make_ctx, served, monkeypatch):
    usage = render.usage
    monkeypatch.setattr(render, "usage", lambda prompt, completion: usage(prompt + 1, completion))
    section = _run(make_ctx, served)
    failed = {r["check"] for r in section["checks"] if not r["passed"]}
    assert failed == {"prompt_tokens"}, section["checks"]
    row = _rows(section)["prompt_tokens"]
    assert row["target"] == [n + 1 for n in row["reference"]]
    assert any("prompt_tokens" in r for r in verdicts.judge("conformance", section).reasons)
