"""The tool-call parsers and the reasoning split as units: each family's call text (as its template writes it)
parsed into OpenAI tool calls, malformed calls reported and never returned as valid, and streamed deltas that
add up to the whole message whatever the chunking."""

from __future__ import annotations

import json

import pytest

from agents.runtime.server.chat_output import ChatSettings, StreamedChoice, read_text
from agents.runtime.server.errors import APIError
from agents.runtime.server.reasoning import detect_reasoning, split_reasoning
from agents.runtime.server.tool_parsers import PARSERS, detect
from agents.runtime.server.tools import tool_request
from tests.runtime.tool_models import TEMPLATES

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]

# per family: text with two calls (get_weather {"city": "Paris", "days": 2}, get_time {}) after "Sure."
CALLS = {
    "hermes": 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    "mistral": 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
               '{"name": "get_time", "arguments": {}}]',
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
                   '{"name": "get_time", "parameters": {}}',
    "deepseek_v3": 'Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
                   '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>'
                   'get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "kimi_k2": 'Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
               '{"city": "Paris", "days": 2}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
               '<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>',
}
MALFORMED = {  # family -> (text, what the error says)
    "hermes": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>', "not valid JSON"),
    "mistral": ('[TOOL_CALLS][{"name": "launch", "arguments": {}}]', "unknown function 'launch'"),
    "llama3_json": ('{"name": "get_weather", "parameters": {"days": 2}}', "missing required argument(s) city"),
    "deepseek_v3": ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
                    '{"city": 7}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "must be of type string"),
    "kimi_k2": ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
                '{"city": "Paris"', "malformed"),
}


def settings(family: str, body: dict | None = None, reasoning: str | None = None) -> ChatSettings:
    return ChatSettings(tool_request(body or {"tools": TOOLS}), PARSERS[family], reasoning)


@pytest.mark.parametrize("family", sorted(CALLS))
def test_each_template_selects_its_parser(family):
    assert detect(TEMPLATES[family]) in (family, "hermes")
    assert PARSERS[detect(TEMPLATES[family])] is PARSERS[family]


@pytest.mark.parametrize("family", sorted(CALLS))
def test_parallel_calls_parse_into_openai_tool_calls(family):
    msg = read_text(settings(family), CALLS[family])
    assert msg.errors == []
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.calls] == [
        ("function", "get_weather", {"city": "Paris", "days": 2}), ("function", "get_time", {})]
    assert all(isinstance(c["function"]["arguments"], str) and c["id"] for c in msg.calls)
    assert (msg.content or "").strip() in ("Sure.", "")
    if family == "kimi_k2":
        assert [c["id"] for c in msg.calls] == ["functions.get_weather:0", "functions.get_time:1"]
    if family == "mistral":
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in msg.calls)


@pytest.mark.parametrize("family", sorted(MALFORMED))
def test_a_malformed_call_is_reported_and_returned_as_content(family):
    text, says = MALFORMED[family]
    msg = read_text(settings(family), text)
    assert msg.calls == [] and msg.content == text
    assert msg.errors and says in " ".join(msg.errors)


def test_newer_mistral_and_deepseek_forms():
    msg = read_text(settings("mistral"), '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time[ARGS]{}')
    assert [c["function"]["name"] for c in msg.calls] == ["get_weather", "get_time"] and not msg.errors
    text = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo"}<｜tool▁call▁end｜>'
            '<｜tool▁calls▁end｜>')
    assert read_text(settings("deepseek_v3"), text).calls[0]["function"]["arguments"] == '{"city": "Oslo"}'


def test_prose_is_content_and_tool_choice_is_checked():
    assert read_text(settings("llama3_json"), 'I think {"name": "x"} is JSON').calls == []
    plain = read_text(settings("hermes", {"tools": TOOLS, "tool_choice": "required"}), "no call here")
    assert plain.content == "no call here" and "required" in plain.errors[0]
    named = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    wrong = read_text(settings("hermes", named), CALLS["hermes"])
    assert wrong.calls == [] and "get_time" in wrong.errors[0]
    one = {"tools": TOOLS, "parallel_tool_calls": False}
    assert "parallel_tool_calls" in read_text(settings("hermes", one), CALLS["hermes"]).errors[0]
    assert read_text(settings("hermes", {"tools": TOOLS, "tool_choice": "none"}), CALLS["hermes"]).calls == []


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"tools": {"a": 1}}, "tools", "must be a list"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "tools",
     "parameters must be a JSON schema of type object"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "given twice"),
    ({"tools": [WEATHER] * 129}, "tools", "at most 128"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "must be"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "not in"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
])
def test_bad_tools_are_400s_naming_the_field(body, param, says):
    with pytest.raises(APIError) as err:
        tool_request(body)
    assert err.value.status == 400 and err.value.param == param and says in err.value.message


def test_reasoning_split_and_detection():
    assert detect_reasoning(TEMPLATES["hermes"]) == "qwen3"
    assert detect_reasoning(TEMPLATES["deepseek_v3"]) == "deepseek_r1"
    assert detect_reasoning(TEMPLATES["mistral"]) is None
    assert split_reasoning("deepseek_r1", "plan it\n</think>\n\nAnswer", True) == ("plan it\n", "Answer")
    assert split_reasoning("deepseek_r1", "still thinking", True) == ("still thinking", "")
    assert split_reasoning("qwen3", "<think>\nhm</think>\n\nHi", True) == ("hm", "Hi")
    assert split_reasoning("qwen3", "Hi", True) == (None, "Hi")


def _streamed(chat: ChatSettings, text: str, size: int) -> dict:
    stream, deltas = StreamedChoice(chat), []
    pieces = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    for piece in pieces[:-1]:
        deltas.append(stream.feed(piece))
    deltas += stream.finish(pieces[-1])[0]
    out: dict = {"reasoning": "", "content": "", "calls": {}}
    for d in deltas:
        out["reasoning"] += d.get("reasoning_content", "")
        out["content"] += d.get("content", "")
        for call in d.get("tool_calls", []):
            slot = out["calls"].setdefault(call["index"], {"name": "", "arguments": ""})
            if "id" in call:
                assert slot["name"] == "" and call["function"]["name"], "id and name come first"
                slot["name"] = call["function"]["name"]
            slot["arguments"] += call["function"]["arguments"]
    return out


@pytest.mark.parametrize("family", sorted(CALLS))
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streamed_deltas_add_up_to_the_whole_message(family, size):
    texts = (CALLS[family], MALFORMED[family][0], "just words", "<think>\nweigh it</think>\n\n" + CALLS[family])
    for text, chat in [(t, c) for t in texts for c in (settings(family, reasoning="qwen3"), ChatSettings())]:
        whole = read_text(chat, text)
        got = _streamed(chat, text, size)
        assert got["content"] == (whole.content or "") and got["reasoning"] == (whole.reasoning or "")
        assert [got["calls"][i] for i in sorted(got["calls"])] == [
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in whole.calls]


@pytest.mark.parametrize("family", sorted(CALLS))
def test_forced_calls_stream_their_arguments_as_written(family):
    """Calls forced by the grammar: each call's id and name go out once written, then its arguments piece by
    piece before the answer ends; the pieces add up to the whole message's arguments, the text as written."""
    chat = settings(family, {"tools": TOOLS, "tool_choice": "required"})
    chat.forced = True
    text = CALLS[family]
    stream, early = StreamedChoice(chat), []
    for i in range(0, len(text) - 1, 2):
        early += stream.feed(text[i:i + 2]).get("tool_calls", [])
    assert len([c for c in early if c["function"]["arguments"]]) >= 4  # several pieces, for both calls
    assert [c["function"]["name"] for c in early if "id" in c] == ["get_weather", "get_time"]
    got = _streamed(chat, text, 2)
    whole = read_text(chat, text)
    assert [got["calls"][i] for i in sorted(got["calls"])] == [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in whole.calls]
    assert json.loads(whole.calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 2}
    assert whole.calls[0]["function"]["arguments"] in text  # as written, not re-serialised


def test_parser_flags_reach_the_command_line_and_name_every_parser():
    from agents.runtime.commands.serve import PARSER_NAMES, serve_command

    assert sorted(PARSER_NAMES) == sorted(PARSERS)
    argv = serve_command("m", dtype="float32", device="cpu", tool_call_parser="mistral", reasoning_parser="none")
    assert argv[argv.index("--tool-call-parser") + 1] == "mistral" and argv[argv.index("--reasoning-parser") + 1] == "none"
    assert "--tool-call-parser" not in serve_command("m", dtype="float32", device="cpu")


def test_server_flags_override_what_the_template_says():
    from types import SimpleNamespace

    from agents.runtime.server.handlers.common import ServerState

    kept: list = []
    engine = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=TEMPLATES["hermes"], keep_in_text=kept.append))
    assert ServerState(None, "m").chat_parsers(engine) == (PARSERS["hermes"], "qwen3")
    assert kept == [("<tool_call>", "</tool_call>")]
    assert ServerState(None, "m", tool_parser="none", reasoning_parser="none").chat_parsers(engine) == (None, "none")
    assert ServerState(None, "m", tool_parser="kimi_k2").chat_parsers(engine)[0] is PARSERS["kimi_k2"]


def test_a_special_marker_token_stays_in_the_decoded_text(tmp_path):
    """Mistral's [TOOL_CALLS] is a control (special) token: decoded text keeps it once the parser asks, while
    the other special tokens (BOS) still drop out."""
    import shutil

    from tokenizers import Tokenizer as Fast

    from agents.runtime.engine.tokenizer import Tokenizer
    from agents.runtime.testing.make_model import cached_model

    base = cached_model("llama")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(base / name, tmp_path / name)
    fast = Fast.from_file(str(tmp_path / "tokenizer.json"))
    fast.add_special_tokens(["[TOOL_CALLS]", "[ARGS]"])
    fast.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(tmp_path)
    ids = tok.encode("hi[TOOL_CALLS]get_time[ARGS]{}")
    assert tok.decode(ids) == "higet_time{}"
    assert tok.keep_in_text(PARSERS["mistral"].tokens) == ["[ARGS]", "[TOOL_CALLS]"]
    assert tok.decode(ids) == "hi[TOOL_CALLS]get_time[ARGS]{}" and ids[0] == tok.token_to_id("<s>")
    assert tok.decode(ids, skip_special_tokens=False).startswith("<s>")
    assert tok.keep_in_text(["<tool_call>"]) == []  # not a token here: nothing changes
