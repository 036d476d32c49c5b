"""Tools and reasoning end to end over HTTP, one tiny model per tool-call format (tests/runtime/tool_models.py):
the engine runs the model and is forced to emit the family's call text (ForcedOutput), then the server parses
it. Checked: the non-streamed response, the streamed deltas adding up to it, the OpenAI SDK reading both, the
prompt (tools and a tool-call history) rendered as transformers renders it and counted in usage."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from agents.runtime.engine import LLMEngine
from agents.runtime.server import create_app
from agents.runtime.server.launcher import ServerThread
from tests.runtime.test_tool_parsers import CALLS, MALFORMED, TOOLS
from tests.runtime.tool_models import ForcedOutput, tool_model

# DeepSeek-R1's prompt opens <think>: its answer closes the block before calling
PREFIX = {"deepseek_v3": "plan\n</think>\n\n"}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "abcDEF123", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny"},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture(scope="module", params=sorted(CALLS))
def served(request):
    family = request.param
    engine = LLMEngine(tool_model(family), num_blocks=128, max_pending=16)
    forced = ForcedOutput(engine)
    with ServerThread(create_app(engine, "tiny")) as url:
        yield family, forced, url


def _stream(url: str, body: dict) -> tuple[dict, list[dict]]:
    chunks = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    msg: dict = {"content": "", "reasoning_content": "", "tool_calls": {}}
    finish, errors = None, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            msg["content"] += delta.get("content") or ""
            msg["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls", []):
                slot = msg["tool_calls"].setdefault(call["index"], {"type": None, "function": {"arguments": ""}})
                if "id" in call:
                    slot.update(id=call["id"], type=call["type"])
                    slot["function"]["name"] = call["function"]["name"]
                slot["function"]["arguments"] += call["function"]["arguments"]
            finish = choice["finish_reason"] or finish
            errors = choice.get("day0_tool_call_errors", errors)
    return {**msg, "finish_reason": finish, "errors": errors}, chunks


def _same_as_whole(streamed: dict, choice: dict) -> None:
    message = choice["message"]
    assert streamed["content"] == (message["content"] or "")
    assert streamed["reasoning_content"] == (message.get("reasoning_content") or "")
    calls = [streamed["tool_calls"][i] for i in sorted(streamed["tool_calls"])]
    strip = [{k: v for k, v in c.items() if k != "id"} for c in message.get("tool_calls", [])]
    assert [{k: v for k, v in c.items() if k != "id"} for c in calls] == strip
    assert streamed["finish_reason"] == choice["finish_reason"]
    assert streamed["errors"] == choice.get("day0_tool_call_errors")


def test_forced_calls_parse_stream_identically_and_read_with_the_sdk(served):
    family, forced, url = served
    forced.text(PREFIX.get(family, "") + CALLS[family])
    body = {"messages": HISTORY, "tools": TOOLS, "temperature": 0, "max_tokens": 300}
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and "day0_tool_call_errors" not in choice
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]
    streamed, chunks = _stream(url, body)
    _same_as_whole(streamed, choice)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"

    client = OpenAI(base_url=f"{url}/v1", api_key="none")
    # (tool_choice "auto": a required or named choice is held by the grammar, which the script would fight;
    # forced choices are tested without the script in test_forced_tools.py)
    sdk = client.chat.completions.create(model="tiny", messages=HISTORY, tools=TOOLS, temperature=0,
                                         tool_choice="auto", max_tokens=300)
    got = sdk.choices[0].message.tool_calls
    assert [c.function.name for c in got] == ["get_weather", "get_time"] and sdk.choices[0].finish_reason == "tool_calls"
    names = [c.function.name for chunk in client.chat.completions.create(
        model="tiny", messages=HISTORY, tools=TOOLS, temperature=0, max_tokens=300, stream=True)
        for c in (chunk.choices[0].delta.tool_calls or []) if c.function and c.function.name]
    assert names == ["get_weather", "get_time"]


def test_a_malformed_or_unwanted_call_is_reported_not_passed_on(served):
    family, forced, url = served
    text, says = MALFORMED[family]
    forced.text(PREFIX.get(family, "") + text)
    body = {"messages": HISTORY[:1], "tools": TOOLS, "temperature": 0, "max_tokens": 300}
    choice = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
    assert choice["message"]["content"].endswith(text[-10:]) and says in " ".join(choice["day0_tool_call_errors"])
    _same_as_whole(_stream(url, body)[0], choice)
    # a named or required choice is held by the grammar while decoding (test_forced_tools.py); its check after
    # generation is tested in test_tool_parsers.py


def test_prompt_is_the_template_with_tools_as_transformers_renders_it(served):
    family, forced, url = served
    forced.text("ok")
    path = tool_model(family)
    hf = AutoTokenizer.from_pretrained(path)
    history = [dict(m) for m in HISTORY]
    history[1] = {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}]}  # transformers' form: arguments as an object
    text = hf.apply_chat_template(history, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "get_weather" in text and "sunny" in text and '"city": "Paris"' in text
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": HISTORY, "tools": TOOLS, "max_tokens": 4,
                                                       "return_token_ids": True}, timeout=60).json()
    assert r["choices"][0]["prompt_token_ids"] == hf.encode(text, add_special_tokens=False)
    assert r["usage"]["prompt_tokens"] == len(r["choices"][0]["prompt_token_ids"])
    bad = httpx.post(f"{url}/v1/chat/completions", json={"messages": HISTORY, "tools": [{"type": "function"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools"


def test_reasoning_is_split_and_the_thinking_switch_reaches_the_template(served):
    family, forced, url = served
    if family not in ("hermes", "deepseek_v3"):
        pytest.skip("a template without <think>")
    answer = "weigh it\n</think>\n\nParis." if family == "deepseek_v3" else "<think>\nweigh it</think>\n\nParis."
    forced.text(answer)
    body = {"messages": HISTORY[:1], "temperature": 0, "max_tokens": 100}
    choice = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    assert choice["message"]["reasoning_content"].strip() == "weigh it" and choice["message"]["content"] == "Paris."
    _same_as_whole(_stream(url, body)[0], choice)
    if family == "hermes":
        off = {**body, "chat_template_kwargs": {"enable_thinking": False}, "return_token_ids": True}
        ids = httpx.post(f"{url}/v1/chat/completions", json=off, timeout=60).json()["choices"][0]["prompt_token_ids"]
        on = httpx.post(f"{url}/v1/chat/completions", json={**off, "chat_template_kwargs": {}}, timeout=60).json()
        assert len(ids) > len(on["choices"][0]["prompt_token_ids"])  # the empty think block in the prompt
