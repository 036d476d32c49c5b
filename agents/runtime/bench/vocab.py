"""Which token ids the benchmark's prompts may hold: from the model's tokenizer (given, or the directory a server
says it serves), else the vocabulary size on the server's model card; word prompts only when neither is known.

A token-id prompt has exactly the asked length on any server; a word prompt's length depends on the tokenizer
(~3 tokens a word for a small BPE), which is why a fair comparison needs the ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_VOCAB = 1 << 22  # no tokenizer has 4M entries; a bigger number is a corrupt file or card


@dataclass(frozen=True)
class PromptVocab:
    size: int | None  # ids are drawn from [low, size); None: word prompts
    exclude: frozenset[int]  # never drawn: special tokens, an image placeholder
    source: str

    def describe(self) -> dict[str, Any]:
        return {"kind": "token_ids" if self.size else "words", "vocab_size": self.size, "source": self.source,
                "excluded_ids": len(self.exclude)}


def tokenizer_file(where: Path | str) -> Path:
    """``where``'s tokenizer.json (``where`` is the file itself or a directory holding it)."""
    path = Path(where)
    file = path if path.is_file() else path / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"tokenizer {where}: no tokenizer.json there")
    return file


def tokenizer_vocab(where: Path | str) -> tuple[int, frozenset[int]]:
    """(vocabulary size with added tokens, ids of the special tokens) of a ``tokenizer.json``."""
    from tokenizers import Tokenizer

    file = tokenizer_file(where)
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises its own Exception type for a malformed file
        raise ValueError(f"tokenizer {file}: unreadable: {exc}") from None
    size = tok.get_vocab_size(with_added_tokens=True)
    if not 2 <= size <= MAX_VOCAB:
        raise ValueError(f"tokenizer {file}: vocabulary of {size} entries is out of range [2, {MAX_VOCAB}]")
    special = frozenset(i for i, added in tok.get_added_tokens_decoder().items() if added.special)
    return size, special


def _card_int(card: dict[str, Any], key: str) -> int | None:
    value = card.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_VOCAB else None


def resolve_vocab(card: dict[str, Any], tokenizer: Path | str | None = None) -> PromptVocab:
    """The prompt vocabulary for a server whose ``/v1/models`` entry is ``card``. ``tokenizer``: the model's
    tokenizer directory (or file), which wins; else the card's ``vocab_size`` (this runtime's servers); else
    the tokenizer of the directory the card names as its ``root`` when it is on this machine (vLLM's servers);
    else word prompts."""
    card_vocab = _card_int(card, "vocab_size")
    image = _card_int(card, "image_token_id")
    extra = frozenset([image]) if image is not None else frozenset()
    if tokenizer is not None:
        size, special = tokenizer_vocab(tokenizer)
        if card_vocab and size > card_vocab:
            size = card_vocab  # ids past the model's embedding would be refused
        return PromptVocab(size, special | extra, f"tokenizer {tokenizer}")
    if card_vocab:
        return PromptVocab(card_vocab, extra, "the server's model card (vocab_size)")
    root = card.get("root")
    if isinstance(root, str) and root and len(root) < 4096:
        try:
            size, special = tokenizer_vocab(root)
        except (ValueError, OSError):
            pass
        else:
            return PromptVocab(size, special | extra, f"tokenizer of the served model directory {root}")
    return PromptVocab(None, extra, "words: the server gives no vocab_size and no tokenizer was given "
                                    "(pass --tokenizer DIR for prompts of the exact length)")
