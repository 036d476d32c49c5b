"""Forced tool calls over HTTP on the tiny random-weight tool-template models (tests/runtime/tool_models.py),
WITHOUT the scripting hook: ``tool_choice`` ``required`` or a named function is held by the grammar while
decoding, so even random weights write calls that parse and validate, in each family's format; the streamed
deltas add up to the whole message and a forced call's arguments arrive in several pieces."""

from __future__ import annotations

import json

import httpx
import pytest

from agents.runtime.engine import LLMEngine
from agents.runtime.server import create_app
from agents.runtime.server.launcher import ServerThread
from agents.runtime.server.tools import tool_request
from agents.runtime.server.tools_grammar import forced_call_lark
from tests.runtime.test_server_tools import _same_as_whole, _stream
from tests.runtime.tool_models import tool_model

# schemas a random model finishes in a few tokens: enums and small integers, no free strings or extra keys
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
    "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
FAMILIES = ("deepseek_v3", "hermes", "kimi_k2", "llama3_json", "mistral")
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module", params=FAMILIES)
def served(request):
    engine = LLMEngine(tool_model(request.param), num_blocks=256, max_pending=16)
    with ServerThread(create_app(engine, "tiny")) as url:
        yield request.param, engine, url


def _check(choice: dict, names: set[str]) -> list[dict]:
    assert choice["finish_reason"] == "tool_calls", choice
    assert "day0_tool_call_errors" not in choice
    calls = choice["message"]["tool_calls"]
    for call in calls:
        args = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] in names
        if call["function"]["name"] == "get_weather":
            assert args["city"] in ("Paris", "Oslo", "Lima") and 1 <= args["days"] <= 7 and set(args) == {"city", "days"}
        else:
            assert set(args) == {"utc"} and isinstance(args["utc"], bool)
    return calls


def _required(url: str, seed: int) -> None:
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 1.0, "seed": seed,
            "max_tokens": 380}
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
    calls = _check(whole["choices"][0], {"get_weather", "get_time"})
    assert calls
    streamed, chunks = _stream(url, body)
    _same_as_whole(streamed, whole["choices"][0])
    pieces = [c for chunk in chunks for ch in chunk["choices"] for c in ch["delta"].get("tool_calls", [])
              if c.get("function", {}).get("arguments")]
    assert len(pieces) > len(calls)  # the arguments came piece by piece, not once per call


def test_required_and_named_calls_are_forced_and_stream_as_written(served):
    family, engine, url = served
    masked = engine.stats()["grammar_mask_rows"]
    _required(url, seed=0)
    named = {"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
             "temperature": 0, "max_tokens": 380}
    choice = httpx.post(f"{url}/v1/chat/completions", json=named, timeout=120).json()["choices"][0]
    assert len(_check(choice, {"get_time"})) == 1  # a named function is called once
    _same_as_whole(_stream(url, named)[0], choice)
    assert engine.stats()["grammar_mask_rows"] > masked  # the cost is counted in the grammar metrics


@pytest.mark.slow  # more sampled answers per format (~10 s each on a loaded host)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_more_sampled_required_calls(served, seed):
    _required(served[2], seed)


def test_auto_stays_unconstrained_and_forcing_refuses_response_format(served):
    family, engine, url = served
    masked = engine.stats()["grammar_mask_rows"]
    body = {"messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 8}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    assert engine.stats()["grammar_mask_rows"] == masked
    both = {**body, "tool_choice": "required", "response_format": {"type": "json_object"}}
    r = httpx.post(f"{url}/v1/chat/completions", json=both, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


def test_special_token_markers_use_the_token_syntax():
    req = tool_request({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    special = {"[TOOL_CALLS]": "<[5]>"}
    lark = forced_call_lark("mistral", req, lambda t: special.get(t, json.dumps(t)))
    assert "calls: <[5]> %json" in lark and '"maxItems": 1' in lark
    lark = forced_call_lark("hermes", req, json.dumps, reasoning="deepseek_r1", reasoning_budget=10)
    assert "start: reason calls" in lark and "{0,10}" in lark
    with pytest.raises(ValueError, match="no forced-call grammar"):
        forced_call_lark("pythonic", req, json.dumps)


def test_a_special_marker_token_is_forced_as_that_token(tmp_path):
    """Where [TOOL_CALLS] and [ARGS] are special tokens of the tokenizer (Mistral's control tokens), the grammar
    names them by id: the call written with the tokens is accepted, the same text spelled out in pieces is not."""
    import shutil

    from tokenizers import Tokenizer as Fast

    from agents.runtime.engine.grammar import GrammarEngine, grammar_from_lark
    from agents.runtime.engine.tokenizer import Tokenizer
    from agents.runtime.testing.make_model import cached_model

    base = cached_model("llama")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(base / name, tmp_path / name)
    fast = Fast.from_file(str(tmp_path / "tokenizer.json"))
    fast.add_special_tokens(["[TOOL_CALLS]", "[ARGS]"])
    fast.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(tmp_path)
    engine = GrammarEngine(tok, fast.get_vocab_size(), set(tok.eos_token_ids))
    marker = fast.token_to_id("[TOOL_CALLS]")
    assert engine.literal("[TOOL_CALLS]") == f"<[{marker}]>" and engine.literal("<tool_call>") == '"<tool_call>"'
    req = tool_request({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    grammar = grammar_from_lark(forced_call_lark("mistral", req, engine.literal, template="[ARGS]"))

    def accepted(ids: list[int]) -> bool:
        m = engine.matcher(grammar)
        return all(m.consume_token(t) for t in ids) and m.is_accepting()

    call = fast.encode('[TOOL_CALLS]get_time[ARGS]{"utc": true}', add_special_tokens=False).ids
    assert marker in call and accepted(call)
    spelled = [t for piece in ("[", "TOOL_CALLS]", 'get_time') for t in fast.encode(piece, add_special_tokens=False).ids]
    assert marker not in spelled and not accepted(spelled)
