"""`day0` subcommands that belong to the runtime (no Django), and the runtime's own command line.

``python -m agents.runtime serve|estimate|make-model|bench …`` runs them without the Django project's package
(the pipeline starts its servers that way); the ``day0`` command registers the same modules beside the portal's
and the agent's, and both parse and dispatch through ``run``. Each module exposes ``register(subparsers)``, which
adds its parser and sets ``handler``; registration stays cheap (torch is imported inside the handlers)."""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Iterable

COMMAND_MODULES: tuple[str, ...] = (
    "agents.runtime.commands.estimate",  # estimate
    "agents.runtime.commands.make_model",  # make-model
    "agents.runtime.commands.serve",  # serve
    "agents.runtime.commands.bench",  # bench
)


def build_parser(prog: str, description: str, modules: Iterable[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    """A parser with one subcommand (or more) per module of ``modules``, registered in that order."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in modules:
        importlib.import_module(module_name).register(subparsers)
    return parser


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parses ``argv`` (this process's own arguments when None) and runs the chosen subcommand's handler; the
    exit code (2 with the help when no subcommand was given, 130 on Ctrl-C)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
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


def main(argv: list[str] | None = None) -> int:
    """``python -m agents.runtime``: the runtime's commands alone."""
    parser = build_parser("python -m agents.runtime", "The Day-0 inference runtime: serve, estimate, make-model, "
                                                      "bench (the same commands as `day0 …`, without the portal).")
    return run(parser, argv)
