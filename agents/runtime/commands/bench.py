"""``day0 bench URL``: the serving benchmark against a live OpenAI-compatible endpoint (this runtime's, vLLM's or
any other): token-id prompts of exactly ``--input-len`` tokens whenever the vocabulary is known (the server's
model card, ``--tokenizer DIR``, or the directory a vLLM server names as its root), fresh prompts per
concurrency level."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"concurrencies must be positive integers, got {text!r}")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark a live OpenAI-compatible endpoint")
    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=_int_list, default=[1, 4, 16], help="comma-separated, e.g. 1,4,16")
    p.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per second (default: all)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--long-input-len", type=int, default=None, help="long-context case (default: fill context)")
    p.add_argument("--no-long-context", action="store_true")
    p.add_argument("--min-seconds", type=float, default=0.0,
                   help="each level runs on with fresh prompts until it has run this long (the portal's baseline "
                        "asks 2 s and 16 requests a level)")
    p.add_argument("--no-probe", action="store_true",
                   help="skip the repeated-prompt probe (the highest level with one prompt repeated, then fresh)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--images-per-request", type=int, default=0,
                   help="N > 0: chat requests with N images each (a vision-language model)")
    p.add_argument("--api-key", default=None,
                   help="Bearer key of a server started with --api-key (default: $DAY0_API_KEY)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="the model's tokenizer directory (tokenizer.json), for token-id prompts of the exact length on "
                        "a server whose /v1/models has no vocab_size (vLLM's)")
    p.add_argument("--json", type=Path, default=None, help="write the bench section here")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import httpx

    from agents.runtime.bench import format_table, run_benchmark

    try:
        section = run_benchmark(
            args.url,
            concurrency=args.concurrency,
            input_len=args.input_len,
            output_len=args.output_len,
            num_prompts=args.num_prompts,
            request_rate=args.request_rate,
            long_context=not args.no_long_context,
            long_input_len=args.long_input_len,
            seed=args.seed,
            images_per_request=args.images_per_request,
            api_key=args.api_key or os.environ.get("DAY0_API_KEY") or None,
            tokenizer=args.tokenizer,
            min_seconds=args.min_seconds,
            probe=not args.no_probe,
        )
    except (ValueError, RuntimeError, httpx.HTTPError) as exc:
        print(f"day0 bench: {args.url}: {exc}")
        return 1
    print(format_table(section))
    prompts = section["prompts"]
    print(f"prompts: {prompts['kind']} ({prompts['source']})")
    if args.json:
        args.json.write_text(json.dumps(section, indent=2))
        print(f"wrote {args.json}")
    return 0 if all(run["failed"] == 0 for run in section["runs"]) else 1
