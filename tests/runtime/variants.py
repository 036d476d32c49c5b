"""Small models of any transformers config, saved with random weights, for the config-variant tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from agents.runtime.testing.make_model import cached_model


def save_variant(tmp: Path, config, scale: float = 0.02, max_shard_size: str | None = None,
                 tokenizer: bool = False) -> Path:
    """``config``'s model with its weights perturbed by ``scale`` (biases and norms are zero/one by default: this
    makes them matter), saved to ``tmp``; with ``tokenizer``, the tiny Llama's tokenizer beside it (512 tokens:
    the config's vocabulary must be that size) so an engine can serve it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    model.save_pretrained(tmp, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    if tokenizer:
        source = cached_model("llama")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(source / name, tmp / name)
    return tmp
