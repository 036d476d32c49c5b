"""The OpenAI SDK's tool-calling example, unchanged, against ``day0 serve`` on the real SmolLM2-135M-Instruct with
the repository's Hermes-style tool template given by ``--chat-template``: with ``tool_choice`` required or a
named function the SDK gets a valid ``tool_calls`` entry (forced by the grammar while decoding), sends the tool's
result back and gets a final answer; the SDK's ``parse`` helpers (``pydantic_function_tool``, a pydantic
``response_format``) read what the server returns."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agents.runtime.commands.serve import serve_command
from agents.runtime.server.launcher import free_port
from tests.real_model_fixtures import smollm2  # noqa: F401 - the session fixture
from tests.runtime.served import wait_until_ready

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "agents" / "runtime" / "server" / "templates" / "hermes_tools.jinja"
# OpenAI's function-calling guide, as written there
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get current temperature for a given location.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"}},
            "required": ["location"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}]


def get_weather(location: str) -> str:
    return f"14 degrees Celsius and sunny in {location}"


@pytest.fixture(scope="module")
def client(smollm2, tmp_path_factory):  # noqa: F811
    openai = pytest.importorskip("openai")
    tmp = tmp_path_factory.mktemp("serve-tools")
    port = free_port()
    log = tmp / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("DAY0_API_KEY", None)
    argv = serve_command(smollm2, dtype="float32", device="cpu", port=port,
                         args=["--num-blocks", "256", "--served-model-name", "smol", "--chat-template", TEMPLATE])
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, log, timeout=240)
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow  # loads the real model in a server process
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_the_sdk_tool_calling_example_runs_unchanged(client, tool_choice):
    input_messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    # (one call: SmolLM2 allowed parallel calls goes on calling; max_tokens: a CPU-sized bound)
    completion = client.chat.completions.create(model="smol", messages=input_messages, tools=TOOLS,
                                                tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=60)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    tool_call = choice.message.tool_calls[0]
    assert tool_call.function.name == "get_weather"
    args = json.loads(tool_call.function.arguments)
    assert set(args) == {"location"} and isinstance(args["location"], str)
    result = get_weather(args["location"])

    input_messages.append(choice.message)  # the SDK's own message object, sent back as it is
    input_messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": str(result)})
    completion_2 = client.chat.completions.create(model="smol", messages=input_messages, tools=TOOLS,
                                                  tool_choice="none", max_tokens=40, temperature=0)
    final = completion_2.choices[0].message
    assert final.content and final.content.strip() and not final.tool_calls
    assert completion_2.usage.prompt_tokens > completion.usage.prompt_tokens  # the call and result went back

    streamed = client.chat.completions.create(model="smol", messages=input_messages[:1], tools=TOOLS,
                                              tool_choice=tool_choice, max_tokens=60, temperature=0, stream=True,
                                              parallel_tool_calls=False)
    pieces = [d.function.arguments for chunk in streamed for d in (chunk.choices[0].delta.tool_calls or [])
              if d.function and d.function.arguments]
    assert len(pieces) > 1 and isinstance(json.loads("".join(pieces))["location"], str)


@pytest.mark.slow
def test_the_sdk_parse_helpers(client):
    from openai import pydantic_function_tool
    from pydantic import BaseModel, Field

    class GetWeather(BaseModel):
        location: str

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)

    parse = client.chat.completions.parse
    resp = parse(model="smol", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                 tools=[pydantic_function_tool(GetWeather)], tool_choice="required", max_tokens=60,
                 parallel_tool_calls=False)
    call = resp.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, GetWeather) and call.function.parsed_arguments.location
    resp = parse(model="smol", messages=[{"role": "user", "content": "Name a city in France as JSON."}],
                 response_format=City, max_tokens=80, temperature=0)
    assert isinstance(resp.choices[0].message.parsed, City)
