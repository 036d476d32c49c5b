"""Text in and out: the model's tokenizer, its chat template (rendered with jinja2) and its stop tokens."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatFormatError(ValueError):
    """The messages of a chat request are malformed, or the model has no chat template."""


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _raise(message: str) -> None:
    raise ChatFormatError(f"chat template: {message}")


RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})


class Tokenizer:
    """``tokenizer.json`` through the fast ``tokenizers`` library (``transformers`` when it is absent)."""

    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        self._fast = None
        self._hf = None
        if (model_dir / "tokenizer.json").exists():
            from tokenizers import Tokenizer as FastTokenizer

            self._fast = FastTokenizer.from_file(str(model_dir / "tokenizer.json"))
        else:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(model_dir))
        cfg_path = model_dir / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        self.bos_token = _token_str(self.config.get("bos_token"))
        self.eos_token = _token_str(self.config.get("eos_token"))
        template = self.config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_path = model_dir / "chat_template.jinja"
        if template is None and jinja_path.exists():
            template = jinja_path.read_text()
        self.chat_template: str | None = template
        self._compiled = None
        self.eos_token_ids = self._eos_ids(model_dir)
        self._token_texts: dict[int, tuple[str, str]] = {}
        self._max_token_chars: int | None = None
        self._dropped: frozenset[int] | None = None  # with keep_in_text: the special ids text leaves out

    def _eos_ids(self, model_dir: Path) -> set[int]:
        ids: set[int] = set()
        gen_path = model_dir / "generation_config.json"
        if gen_path.exists():
            eos = json.loads(gen_path.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if self.eos_token is not None:
            tid = self.token_to_id(self.eos_token)
            if tid is not None:
                ids.add(tid)
        return ids

    @property
    def vocab_size(self) -> int:
        if self._fast is not None:
            return self._fast.get_vocab_size(with_added_tokens=True)
        return len(self._hf)

    def special_ids(self) -> set[int]:
        """Every special or added token's id (BOS, EOS, pad, image and other control tokens): ids no ordinary text
        encodes to."""
        ids = set(self.eos_token_ids)
        if self._fast is not None:
            ids.update(int(i) for i in self._fast.get_added_tokens_decoder())
        else:
            ids.update(int(i) for i in getattr(self._hf, "all_special_ids", ()) or ())
            ids.update(int(i) for i in getattr(self._hf, "added_tokens_decoder", {}) or {})
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            text = _token_str(self.config.get(name))
            tid = self.token_to_id(text) if text else None
            if tid is not None:
                ids.add(tid)
        return ids

    def token_to_id(self, token: str) -> int | None:
        if self._fast is not None:
            return self._fast.token_to_id(token)
        tid = self._hf.convert_tokens_to_ids(token)
        return None if tid == self._hf.unk_token_id else tid

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=add_special_tokens).ids
        return self._hf.encode(text, add_special_tokens=add_special_tokens)

    def keep_in_text(self, tokens: Any) -> list[str]:
        """Keep these special tokens in decoded text (a tool-call format's markers, such as Mistral's
        ``[TOOL_CALLS]`` control token, which the parser must see); the other special tokens still drop out.
        Returns the ones that are special tokens of this vocabulary."""
        special = self._special_only()
        kept = {tid: t for t in tokens if (tid := self.token_to_id(t)) is not None and tid in special}
        if kept:
            self._dropped = frozenset(special - set(kept))
            self._token_texts = {}
        return sorted(kept.values())

    def _special_only(self) -> set[int]:
        if self._fast is not None:
            ids = {int(i) for i, t in self._fast.get_added_tokens_decoder().items() if t.special}
        else:
            ids = {int(i) for i in getattr(self._hf, "all_special_ids", ()) or ()}
        return ids | set(self.eos_token_ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens and self._dropped is not None:
            ids, skip_special_tokens = [i for i in ids if i not in self._dropped], False
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=skip_special_tokens)
        return self._hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token as it stands alone (special tokens included), for logprobs listings."""
        return self._texts(token_id)[0]

    def visible_len(self, token_id: int) -> int:
        """Characters the token adds to decoded text (0 for a special token such as BOS): text offsets."""
        return len(self._texts(token_id)[1])

    def _texts(self, token_id: int) -> tuple[str, str]:
        texts = self._token_texts.get(token_id)
        if texts is None:
            texts = (self.decode([token_id], skip_special_tokens=False), self.decode([token_id]))
            if len(self._token_texts) < 1 << 20:
                self._token_texts[token_id] = texts
        return texts

    @property
    def max_token_chars(self) -> int:
        """The longest vocabulary entry in characters: a text of C characters is at least about
        C / max_token_chars tokens, so a prompt far longer than the context is refused before tokenizing."""
        if self._max_token_chars is None:
            vocab = self._fast.get_vocab(with_added_tokens=True) if self._fast is not None else self._hf.get_vocab()
            self._max_token_chars = max((len(t) for t in vocab), default=1)
        return self._max_token_chars

    def use_chat_template(self, template: str) -> None:
        """Render chats with ``template`` (a Jinja text, as transformers reads a template file) from now on."""
        try:
            jinja2.Environment().parse(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"the chat template does not parse: {exc} (line {exc.lineno})") from None
        self.chat_template = template
        self._compiled = None

    def apply_chat_template(self, messages: Any, add_generation_prompt: bool = True,
                            template_kwargs: dict[str, Any] | None = None,
                            tools: list[dict[str, Any]] | None = None) -> str:
        """Render validated ``messages`` with the model's template; ChatFormatError names what is wrong.
        ``tools`` (OpenAI's function tools) and ``template_kwargs`` (a request's ``chat_template_kwargs``, e.g.
        ``enable_thinking``) reach the template as transformers passes them."""
        check_messages(messages)
        if not self.chat_template:
            raise ChatFormatError("this model has no chat template (tokenizer_config.json chat_template)")
        if self._compiled is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)
            env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._compiled = env.from_string(self.chat_template)
        flat = [_flat_message(m) for m in messages]
        context = {**(template_kwargs or {}), "messages": flat, "add_generation_prompt": add_generation_prompt,
                   "bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        context.pop("tools", None)  # only the request's own tools
        if tools:
            context["tools"] = tools
        try:
            return self._compiled.render(**context)
        except jinja2.TemplateError as exc:
            raise ChatFormatError(f"chat template failed: {exc}") from exc

    def encode_chat(self, messages: Any) -> list[int]:
        text = self.apply_chat_template(messages)
        # the template writes the BOS itself when the model wants one
        return self.encode(text, add_special_tokens=False)


def _content_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


def _flat_message(msg: dict[str, Any]) -> dict[str, Any]:
    """A message as templates read it: text content joined; an assistant's tool-call arguments (a JSON string in
    OpenAI's form) as the object templates serialise with ``tojson``."""
    flat = {**msg, "content": _content_text(msg.get("content"))}
    if msg.get("tool_calls"):
        calls = []
        for call in msg["tool_calls"]:
            function = dict(call["function"])
            try:
                args = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = None
            if isinstance(args, dict):
                function["arguments"] = args
            calls.append({**call, "function": function, **function})  # both call.function.name and call.name
        flat["tool_calls"] = calls
    return flat


def _check_tool_calls(i: int, calls: Any) -> None:
    if not isinstance(calls, list) or not calls:
        raise ChatFormatError(f"messages[{i}].tool_calls must be a non-empty list")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments", ""), str)):
            raise ChatFormatError(f"messages[{i}].tool_calls[{j}] must be {{\"id\": ..., \"type\": \"function\", "
                                  f"\"function\": {{\"name\": string, \"arguments\": JSON string}}}}")


def check_messages(messages: Any) -> None:
    """Raise ChatFormatError naming the first malformed message."""
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("'messages' must be a non-empty list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ChatFormatError(f"messages[{i}] must be an object")
        role = msg.get("role")
        if role not in ROLES:
            raise ChatFormatError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        if msg.get("tool_calls") is not None:
            if role != "assistant":
                raise ChatFormatError(f"messages[{i}]: only an assistant message has tool_calls")
            _check_tool_calls(i, msg["tool_calls"])
            if msg.get("content") is None:
                continue  # a turn of tool calls only
        if role == "tool" and not isinstance(msg.get("tool_call_id", ""), str):
            raise ChatFormatError(f"messages[{i}].tool_call_id must be a string")
        content = msg.get("content")
        if isinstance(content, str):
            continue
        if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
        ):
            continue
        raise ChatFormatError(f"messages[{i}].content must be a string or a list of text parts")
