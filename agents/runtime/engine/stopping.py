"""Finish conditions and incremental detokenisation of one sequence."""

from __future__ import annotations

from agents.runtime.engine.sequence import Sequence
from agents.runtime.engine.tokenizer import Tokenizer


def detokenize(seq: Sequence, tokenizer: Tokenizer) -> None:
    """Extend ``seq.text`` by the text of its newest token(s), waiting while a UTF-8 character is split."""
    ids = seq.token_ids
    prefix = tokenizer.decode(ids[seq.prefix_offset : seq.read_offset])
    full = tokenizer.decode(ids[seq.prefix_offset :])
    if len(full) > len(prefix) and not full.endswith("\ufffd"):
        seq.text += full[len(prefix) :]
        seq.prefix_offset = seq.read_offset
        seq.read_offset = len(ids)


def check_stop(seq: Sequence, token: int, tokenizer: Tokenizer, eos_ids: set[int], max_model_len: int) -> str | None:
    """The finish reason after ``token`` was appended, or None to continue."""
    params = seq.params
    if not params.ignore_eos and token in eos_ids:
        return "stop"
    if token in params.stop_token_ids:
        return "stop"
    detokenize(seq, tokenizer)
    if params.stop and seq.num_output_tokens >= params.min_tokens:  # as vLLM: no stop string before min_tokens
        longest = max(len(s) for s in params.stop)
        start = max(0, seq.emitted_text_len - longest)
        hits = [i for i in (seq.text.find(s, start) for s in params.stop) if i >= 0]
        if hits:
            seq.text = seq.text[: min(hits)]
            return "stop"
    if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None


def emit_text(seq: Sequence) -> str:
    """Text not yet handed out; while running, hold back a tail that could still become a stop string."""
    end = len(seq.text)
    if not seq.is_finished and seq.params.stop:
        end = max(seq.emitted_text_len, end - (max(len(s) for s in seq.params.stop) - 1))
    delta = seq.text[seq.emitted_text_len : end]
    seq.emitted_text_len = end
    return delta
