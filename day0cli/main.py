"""The one `day0` entry point (also ``python -m day0cli``).

Each subcommand lives in the module that owns it; that module exposes ``register(subparsers)`` which adds
its parser and sets ``handler`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit
code). Registration must stay cheap: heavy imports (torch, Django) happen inside the handlers, so
``day0 estimate`` starts fast and the runtime commands work without Django configured. The runtime's commands
are its own (``agents.runtime.commands``, also ``python -m agents.runtime``); this command line delegates to
them, and parses and dispatches the way the runtime's does.
"""

from __future__ import annotations

import argparse

from agents.runtime import commands as runtime_commands

# Each module's register() adds one or more subcommands.
COMMAND_MODULES: tuple[str, ...] = (
    "day0cli.demo",  # day0 demo
    *runtime_commands.COMMAND_MODULES,  # day0 estimate, make-model, serve, bench
    "agents.pipeline.commands",  # day0 adapt
    "agents.worker.commands",  # day0 agent, day0 jobs submit|watch
)


def build_parser() -> argparse.ArgumentParser:
    return runtime_commands.build_parser("day0", "Day-0 Portal: adapt new open-weights models to hardware.",
                                         COMMAND_MODULES)


def main(argv: list[str] | None = None) -> int:
    return runtime_commands.run(build_parser(), argv)

