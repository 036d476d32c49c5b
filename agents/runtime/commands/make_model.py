"""`day0 make-model`: build a random-weight test model (sharded safetensors, tokenizer, chat template)."""

from __future__ import annotations

import argparse
from pathlib import Path

ARCH_CHOICES = ("llama", "qwen3", "mixtral", "qwen3-moe", "deepseek-v3")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-model", help="build a random-weight test model", description=__doc__
    )
    parser.add_argument("--arch", required=True, choices=ARCH_CHOICES)
    parser.add_argument("--size", default="tiny", choices=("tiny", "100m"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output directory (created; must be empty)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from agents.runtime.testing.make_model import describe, make_model

    try:
        path = make_model(args.arch, args.size, args.seed, args.out)
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}")
        return 2
    info = describe(path)
    print(
        f"built {info['architecture']} ({args.size}, seed {args.seed}) in {path}: {info['layers']} layers, "
        f"vocab {info['vocab_size']}, {info['tensors']} tensors in {len(info['shards'])} shards"
    )
    return 0
