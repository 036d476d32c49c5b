"""Constrained decoding through llguidance: grammars built from JSON schemas (``grammar_from_json_schema``,
``grammar_for_response_format``), one matcher per sequence (``GrammarEngine.matcher``), and the per-step token
mask applied inside the batch (``GrammarEngine.apply_masks``), its time counted.

llguidance (the grammar engine vLLM and SGLang use) compiles a schema lazily and computes a token mask in tens
of microseconds, so the mask is computed on the CPU for each constrained row of each step and applied to the
logits before the penalties' output is sampled."""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from agents.runtime.engine.sequence import Sequence

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


class GrammarError(ValueError):
    """A schema or grammar llguidance refuses; the message says why."""


def _llg():
    import llguidance

    return llguidance


def grammar_from_json_schema(schema: dict[str, Any] | bool, *, strict: bool = False) -> str:
    """The llguidance grammar for ``schema``, checked; GrammarError names what is wrong. ``strict`` (OpenAI's
    strict mode): objects take no properties beyond those listed unless the schema says otherwise."""
    if not isinstance(schema, dict | bool):
        raise GrammarError("the schema must be a JSON object")
    llg = _llg()
    overrides = {"whitespace_flexible": False}
    if not strict:
        overrides["coerce_one_of"] = True
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GrammarError(f"invalid JSON schema: {exc}") from None
    ok, message = _validate(grammar)
    if not ok:
        raise GrammarError(f"invalid JSON schema: {message}")
    return grammar


def grammar_from_lark(lark: str) -> str:
    """The llguidance grammar of a Lark text (``%json`` schemas and ``<[id]>`` tokens inside), checked."""
    try:
        grammar = _llg().LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GrammarError(f"invalid grammar: {exc}") from None
    ok, message = _validate(grammar)
    if not ok:
        raise GrammarError(f"invalid grammar: {message}")
    return grammar


def _validate(grammar: str) -> tuple[bool, str]:
    llg = _llg()
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None)
    return (not is_error), "; ".join(messages)


def grammar_for_response_format(response_format: dict[str, Any]) -> str | None:
    """``{"type": "text"}``: None; ``json_object``: any JSON object; ``json_schema``: that schema."""
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return grammar_from_json_schema(JSON_OBJECT_SCHEMA)
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        return grammar_from_json_schema(spec.get("schema", JSON_OBJECT_SCHEMA), strict=bool(spec.get("strict")))
    raise GrammarError(f"unknown response_format type {kind!r}")


class GrammarEngine:
    """The engine's grammar side: the llguidance tokenizer (built once, on first use, from the served model's
    ``tokenizer.json``), a matcher per constrained sequence, and the time spent on masks."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: set[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(eos_ids)
        self._ll_tokenizer = None
        self.mask_seconds = 0.0
        self.mask_rows = 0
        self.mask_steps = 0
        self.last_mask_seconds = 0.0

    def ll_tokenizer(self):
        if self._ll_tokenizer is None:
            llg = _llg()
            fast = getattr(self._tokenizer, "_fast", None)
            eos = self._eos[0] if len(self._eos) == 1 else (self._eos or None)
            if fast is not None:
                self._ll_tokenizer = llg.LLTokenizer(fast.to_str(), n_vocab=self.vocab_size, eos_token=eos)
            else:
                import llguidance.hf

                self._ll_tokenizer = llguidance.hf.from_tokenizer(self._tokenizer._hf, n_vocab=self.vocab_size,
                                                                  eos_token=eos)
        return self._ll_tokenizer

    def literal(self, text: str) -> str:
        """``text`` as a Lark literal for this tokenizer: ``<[id]>`` when it is one special token (which a quoted
        string never matches), else the quoted text."""
        tok = self.ll_tokenizer()
        ids = tok.tokenize_str(text, parse_special=True)
        if len(ids) == 1 and tok.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    def matcher(self, grammar: str):
        """A fresh matcher for ``grammar`` (each choice of ``n`` gets its own); GrammarError when it fails."""
        m = _llg().LLMatcher(self.ll_tokenizer(), grammar)
        if m.is_error():
            raise GrammarError(f"grammar refused: {m.get_error()}")
        return m

    def apply_masks(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Set to -inf every token the row's matcher does not allow next (rows without one untouched)."""
        rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if not rows:
            return logits
        start = time.perf_counter()
        # [R, ceil(V/32)] int32 on the CPU, bit b of word w allowing token 32w + b; each matcher writes its row
        # (llguidance.torch's helpers are not used: importing them compiles a kernel with torch.compile)
        bitmask = torch.empty(len(rows), (self.vocab_size + 31) // 32, dtype=torch.int32)
        row_bytes = bitmask.shape[1] * 4
        for j, i in enumerate(rows):
            seqs[i].matcher.unsafe_compute_mask_ptr(bitmask[j].data_ptr(), row_bytes)
        vocab = logits.shape[1]
        bits = torch.arange(32, dtype=torch.int32)
        allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().reshape(len(rows), -1)  # [R, 32 * W]
        if allowed.shape[1] < vocab:  # logits wider than the tokenizer's vocabulary: the rest is never allowed
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
        allowed = allowed[:, :vocab].to(logits.device)
        logits = logits.float().clone()
        sel = torch.tensor(rows, dtype=torch.long, device=logits.device)
        logits.index_copy_(0, sel, logits.index_select(0, sel).masked_fill(~allowed, float("-inf")))
        took = time.perf_counter() - start
        self.mask_seconds += took
        self.last_mask_seconds = took
        self.mask_rows += len(rows)
        self.mask_steps += 1
        return logits

    @staticmethod
    def advance(seqs: list[Sequence], tokens: list[int]) -> None:
        """Feed each constrained row its sampled token."""
        for seq, token in zip(seqs, tokens, strict=True):
            if seq.matcher is not None and not seq.matcher.is_stopped():
                seq.matcher.consume_token(token)
