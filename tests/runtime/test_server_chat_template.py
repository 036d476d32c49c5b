"""The server's chat template rendering (jinja2 on tokenizer_config.json) equals transformers' own."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agents.runtime.engine.tokenizer import ChatFormatError, Tokenizer
from agents.runtime.testing.make_model import cached_model

MESSAGES = [
    {"role": "system", "content": "be nice"},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": [{"type": "text", "text": "more "}, {"type": "text", "text": "please"}]},
]


def test_rendered_prompt_and_ids_equal_transformers():
    path = cached_model("llama")
    hf, mine = AutoTokenizer.from_pretrained(path), Tokenizer(path)
    flat = [*MESSAGES[:3], {"role": "user", "content": "more please"}]
    assert mine.apply_chat_template(MESSAGES) == hf.apply_chat_template(
        flat, tokenize=False, add_generation_prompt=True
    )
    assert mine.encode_chat(MESSAGES) == hf.encode(
        hf.apply_chat_template(flat, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "non-empty list"),
        ([{"role": "user", "content": 3}], r"messages\[0\].content"),
        ([{"role": "user", "content": "x"}, "hi"], r"messages\[1\] must be an object"),
        ([{"role": "robot", "content": "x"}], r"messages\[0\].role"),
    ],
)
def test_malformed_messages_name_the_problem(messages, match):
    with pytest.raises(ChatFormatError, match=match):
        Tokenizer(cached_model("llama")).apply_chat_template(messages)
