"""The agent's own command line (``agents.worker.commands``, ``python -m agents.worker``): the same ``agent`` and
``jobs`` commands as ``day0``, started without the ``day0`` command's package or Django (the demo starts its agent
this way)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from agents.runtime.commands import build_parser
from agents.worker.commands import main
from day0cli.main import build_parser as build_day0_parser

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(action.choices) if action else {}


def _options(parser: argparse.ArgumentParser) -> list[tuple]:
    """Each argument as the user meets it (flags, destination, default, required, choices, help), and the same
    for each subcommand."""
    own = [(tuple(a.option_strings), a.dest, a.default, a.required, a.choices and tuple(a.choices), a.help)
           for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]
    return own + [(name, _options(sub)) for name, sub in _subparsers(parser).items()]


def test_the_agent_module_has_the_agent_and_jobs_commands_as_day0_has_them() -> None:
    ours = _subparsers(build_parser("python -m agents.worker", "", ("agents.worker.commands",)))
    day0 = _subparsers(build_day0_parser())
    assert list(ours) == ["agent", "jobs"]
    for name in ours:
        assert _options(ours[name]) == _options(day0[name]), name
    assert list(_subparsers(ours["jobs"])) == ["submit", "watch", "list", "cancel"]
    listing = _run("-m", "agents.worker", "--help")
    assert listing.returncode == 0 and "agent     run an adaptation agent" in listing.stdout, listing.stderr


def test_without_a_command_it_prints_the_help_and_exits_2(capsys) -> None:  # noqa: ANN001
    assert main([]) == 2
    assert capsys.readouterr().out.startswith("usage: python -m agents.worker [-h] COMMAND ...")


def test_an_agent_started_as_the_module_loads_neither_django_nor_the_day0_command(tmp_path: Path) -> None:
    """A refused start (a token file others may read) goes as far as the agent's own checks; what it imported on
    the way says which packages an agent process needs."""
    token_file = tmp_path / "agent.token"
    token_file.write_text("d0a_secret\n")
    token_file.chmod(0o644)
    probe = ("import json, sys\nfrom agents.worker.commands import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit as stop:\n    print(stop, file=sys.stderr)\n"
             "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'django', 'day0portal', 'apps', 'day0cli'})\n"
             "print(json.dumps(loaded), file=sys.stderr)")
    done = _run("-c", probe, "agent", "--hardware", "cpu", "--portal", "http://127.0.0.1:9", "--token-file",
                str(token_file))
    lines = done.stderr.strip().splitlines()
    assert "is readable by others (mode 644); chmod 600 it" in lines[-2], done.stderr
    assert json.loads(lines[-1]) == [], done.stderr
