"""SmolLM2-135M-Instruct under ``day0 serve --chat-template`` through the OpenAI SDK: ``response_format``
json_schema answers are valid JSON of the schema in every case of a sample, the template file (not the model's
own) renders the prompt, and ``chat_template_kwargs`` reach it."""

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
# SmolLM2's own ChatML form, with a system line the model's template lacks and a switch from the request
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if answer_prefix is defined %}{{ answer_prefix }}{% endif %}{% endif %}"
)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PROMPTS = [
    "Describe Alice, a 30 year old from Paris, as JSON.",
    "Give a person record for Bob (age 45, London).",
    "Make up a character who lives in Tokyo.",
    "Return JSON for a child named Mia aged 7 in London.",
    "Invent someone. Answer in JSON only.",
]


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory):  # noqa: F811
    openai = pytest.importorskip("openai")
    tmp = tmp_path_factory.mktemp("serve")
    template = tmp / "chatml.jinja"
    template.write_text(TEMPLATE)
    port = free_port()
    log = tmp / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("DAY0_API_KEY", None)
    argv = serve_command(smollm2, dtype="float32", device="cpu", port=port,
                         args=["--num-blocks", "128", "--served-model-name", "smol", "--chat-template", template])
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, log, timeout=240)
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _valid(value: dict) -> bool:
    try:
        import jsonschema
    except ImportError:  # the schema's own rules, checked by hand
        return (set(value) == {"name", "age", "city"} and isinstance(value["name"], str)
                and len(value["name"]) <= 20 and isinstance(value["age"], int) and 0 <= value["age"] <= 150
                and value["city"] in ("Paris", "London", "Tokyo"))
    try:
        jsonschema.validate(value, SCHEMA)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.mark.slow  # loads the real model in a server process
def test_json_schema_answers_are_always_valid(served):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    valid = 0
    for i, prompt in enumerate(PROMPTS):
        extra = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "seed": i}
        resp = served.chat.completions.create(model="smol", messages=[{"role": "user", "content": prompt}],
                                              response_format=fmt, max_tokens=80, **extra)
        choice = resp.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        valid += _valid(json.loads(choice.message.content))
    assert valid == len(PROMPTS)


@pytest.mark.slow
def test_the_template_file_renders_and_takes_request_kwargs(served):
    msgs = [{"role": "user", "content": "Say hi"}]
    plain = served.chat.completions.create(model="smol", messages=msgs, max_tokens=1, temperature=0)
    prefixed = served.chat.completions.create(model="smol", messages=msgs, max_tokens=1, temperature=0,
                                              extra_body={"chat_template_kwargs": {"answer_prefix": "Sure thing:"}})
    # the model's own template adds a default system turn; the file's does not: 7 tokens of ChatML framing
    # around "Say hi", and the prefix adds its tokens to the prompt
    assert plain.usage.prompt_tokens < 15
    assert prefixed.usage.prompt_tokens > plain.usage.prompt_tokens
