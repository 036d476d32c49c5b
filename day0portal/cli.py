"""The one `day0` entry point.

Each subcommand lives in the module that owns it; that module exposes ``register(subparsers)`` which adds
its parser and sets ``handler`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit
code). Registration must stay cheap: heavy imports (torch, Django) happen inside the handlers, so
``day0 estimate`` starts fast and the runtime commands work without Django configured.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Each module's register() adds one or more subcommands.
COMMAND_MODULES: tuple[str, ...] = (
    "day0portal.commands.demo",  # day0 demo
    "agents.runtime.commands.estimate",  # day0 estimate
    "agents.runtime.commands.make_model",  # day0 make-model
    "agents.runtime.commands.serve",  # day0 serve
    "agents.runtime.commands.bench",  # day0 bench
    "agents.pipeline.commands",  # day0 adapt
    "agents.worker.commands",  # day0 agent, day0 jobs submit|watch
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="day0", description="Day-0 Portal: adapt new open-weights models to hardware.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    args.process_argv = argv is None  # parsed from this process's own command line (a re-exec may repeat it)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
