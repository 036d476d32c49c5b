"""Tiny random-weight models whose chat templates declare tools, one per tool-call format, and a hook that makes
an engine emit a fixed text (a random model cannot be sampled into a tool call).

The templates are written here and reproduce each family's token format: where the tools go in the prompt, how
an assistant turn's tool calls and a tool result are written back, and the text a call is generated as. The
weights and tokenizer are the tiny Llama's (``cached_model("llama")``): the families' marker tokens are plain text
to its BPE, which the parsers read the same way (they work on decoded text)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from agents.runtime.testing.make_model import build_once, cached_model

_TOOLS_JSON = "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
_TURNS_CHATML = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
)
TEMPLATES: dict[str, str] = {
    # Qwen2.5 / Hermes, with Qwen3's thinking switch
    "hermes": (
        "{{ bos_token }}{% if tools %}<|im_start|>system\n# Tools\n<tools>\n" + _TOOLS_JSON + "</tools>\n"
        "For each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n"
        "{% endif %}" + _TURNS_CHATML + "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
        "{% endif %}"
    ),
    "mistral": (
        "{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
        "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
        "{% elif m.role == 'tool' %}[TOOL_RESULTS]{\"content\": {{ m.content | tojson }}, \"call_id\": "
        "\"{{ m.tool_call_id }}\"}[/TOOL_RESULTS]"
        "{% elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
        "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}, \"id\": "
        "\"{{ c.id }}\"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}"
        "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% else %}{{ m.content }}\n\n{% endif %}"
        "{% endfor %}"
    ),
    "llama3_json": (
        "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython<|eot_id|>"
        "{% for m in messages %}{% if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
        "{{ m.content }}<|eot_id|>{% elif m.role == 'assistant' and m.tool_calls %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{% for c in m.tool_calls %}{\"name\": \""
        "{{ c.function.name }}\", \"parameters\": {{ c.function.arguments | tojson }}}{% endfor %}<|eom_id|>"
        "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
        "{% if m.role == 'user' and tools and loop.last %}Given the following functions, respond with a JSON for a "
        "function call. Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
        "name and its value}.\n\n" + _TOOLS_JSON + "{% endif %}{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    # DeepSeek-R1 (0528): the tools in the system turn, <think> opened by the generation prompt
    "deepseek_v3": (
        "{{ bos_token }}{% if tools %}## Tools\n" + _TOOLS_JSON + "{% endif %}"
        "{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
        "{% elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}"
        "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
        "{% elif m.role == 'assistant' and m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>"
        "{% for c in m.tool_calls %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ c.function.name }}\n```json\n"
        "{{ c.function.arguments | tojson }}\n```<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
        "{% elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content.split('</think>')[-1] }}<｜end▁of▁sentence｜>"
        "{% else %}{{ m.content }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
    ),
    "kimi_k2": (
        "{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{% endif %}"
        "{% for m in messages %}{% if m.role == 'tool' %}<|im_system|>tool<|im_middle|>## Return of "
        "{{ m.tool_call_id }}\n{{ m.content }}<|im_end|>"
        "{% elif m.role == 'assistant' and m.tool_calls %}<|im_assistant|>assistant<|im_middle|>"
        "<|tool_calls_section_begin|>{% for c in m.tool_calls %}<|tool_call_begin|>{{ c.id }}"
        "<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}"
        "<|tool_calls_section_end|><|im_end|>"
        "{% else %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
    ),
}


def tool_model(family: str) -> Path:
    """The tiny Llama with ``family``'s chat template (its weights linked, its tokenizer config rewritten)."""
    base = cached_model("llama")
    template = TEMPLATES[family]

    def build(out: Path) -> None:
        out.mkdir(parents=True)
        for item in base.iterdir():
            if item.name != "tokenizer_config.json":
                os.symlink(item.resolve(), out / item.name)
        config = json.loads((base / "tokenizer_config.json").read_text())
        (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}, indent=2))

    return build_once(base.parent / f"{base.name}-tools-{family}-{hashlib.sha256(template.encode()).hexdigest()[:10]}", build)


class ForcedOutput:
    """Installed on an engine: while ``script`` is set, every sequence's k-th sampled token is ``script[k]``
    (the model still runs; its logits are replaced at the rows that sample), then EOS."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.script: list[int] | None = None
        run = engine.runner.run_step

        def forced_step(batch):
            step = run(batch)
            if self.script is not None and step.logits is not None:
                eos = min(engine.eos_token_ids)
                logits = torch.full_like(step.logits, float("-inf"))
                for row, seq in enumerate(step.seqs):
                    k = seq.num_output_tokens
                    logits[row, self.script[k] if k < len(self.script) else eos] = 0.0
                step.logits = logits
            return step

        engine.runner.run_step = forced_step

    def text(self, text: str) -> None:
        self.script = self.engine.tokenizer.encode(text, add_special_tokens=False)
