"""A byte-level BPE tokenizer trained locally with ``tokenizers`` on the built-in corpus, saved the way a Hugging
Face model repository ships it: tokenizer.json and tokenizer_config.json with a ChatML-like chat template."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from agents.runtime.testing.corpus import corpus

BOS = "<s>"
EOS = "<|im_end|>"
IM_START = "<|im_start|>"
PAD = "<pad>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, IM_START, PAD)  # ids 0, 1, 2, 3
BOS_ID, EOS_ID, IM_START_ID, PAD_ID = range(4)

# ChatML-like: every turn is <|im_start|>role\ncontent<|im_end|>\n; the prompt starts with the BOS token.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of at most ``vocab_size`` tokens; deterministic for a given size."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the byte alphabet plus special tokens")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Enough generated words that the merges can fill a large vocabulary.
    pseudo = 0 if vocab_size <= 2048 else vocab_size * 12
    tok.train_from_iterator(corpus(pseudo_words=pseudo), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    for token, expected in zip(SPECIAL_TOKENS, range(4), strict=True):
        if tok.token_to_id(token) != expected:
            raise RuntimeError(f"special token {token} got id {tok.token_to_id(token)}, expected {expected}")
    return tok


def save_tokenizer(tok: Tokenizer, out: Path, *, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json (special tokens, chat template) into ``out``."""
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                     "single_word": False}
            for i, t in enumerate(SPECIAL_TOKENS)
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
