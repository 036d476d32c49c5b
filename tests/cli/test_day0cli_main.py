"""The ``day0`` entry point (``day0cli.main``): the commands users' scripts rely on, registered cheaply: building the
parser (``day0 --help``, ``day0 estimate``) imports neither torch nor Django."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_parser_lists_the_commands_and_loads_neither_torch_nor_django() -> None:
    probe = ("import argparse, json, sys\nfrom day0cli.main import build_parser\nparser = build_parser()\n"
             "sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))\n"
             "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'django'})\n"
             "print(json.dumps({'commands': list(sub.choices), 'loaded': loaded}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"commands": ["demo", "estimate", "make-model", "serve", "bench", "adapt",
                                                    "manifest", "agent", "jobs"], "loaded": []}


def test_python_m_day0cli_is_the_day0_command() -> None:
    done = subprocess.run([sys.executable, "-m", "day0cli", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: day0 [-h] COMMAND ..."), done.stderr
