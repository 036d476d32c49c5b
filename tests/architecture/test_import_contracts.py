"""The import contracts of pyproject.toml's ``[tool.importlinter]`` hold: the portal imports no torch, the portal's
apps sit in layers (no pair of apps imports each other both ways, ``core`` at the bottom), the agent layers point
down (worker → pipeline → runtime), the agents import nothing of the portal or Django. import-linter
reads every import statement, those inside functions included, and follows indirect chains.

Runs ``lint-imports`` in a fresh interpreter with this checkout first on the path, so the graph is of these
files and not of whatever checkout the environment's editable install points at."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.argv[0] = 'lint-imports'; lint_imports_command()"


def _lint(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_every_import_contract_is_kept() -> None:
    done = _lint()
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    summary = re.search(r"Contracts: (\d+) kept, (\d+) broken", done.stdout)
    assert summary and int(summary[1]) >= 5 and summary[2] == "0", done.stdout[-2000:]
    assert re.search(r"Portal apps point down .*?KEPT", done.stdout, re.S), done.stdout[-2000:]


def test_the_app_layers_are_checked_in_the_direction_the_code_points(tmp_path: Path) -> None:
    """The app layers, turned upside down, break on arrows that exist: so the kept contract is not vacuous."""
    config = tmp_path / "contracts.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["agents", "apps", "day0portal"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "apps upside down"\ntype = "layers"\ncontainers = ["apps"]\n'
        'layers = ["core", "accounts", "catalog", "jobs"]\n'
    )
    done = _lint(str(config))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "apps.jobs.services -> apps.core" in done.stdout and "apps.catalog" in done.stdout


def test_a_broken_contract_fails_the_check(tmp_path: Path) -> None:
    """The same checker, on this checkout's graph, fails on an arrow that exists (the catalog reads configs
    with the contract's spec parser): so a kept contract above means the arrows it forbids are really absent."""
    config = tmp_path / "contracts.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["agents", "apps", "contract", "day0portal"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "catalog without the runtime"\ntype = "forbidden"\n'
        'source_modules = ["apps.catalog.services"]\nforbidden_modules = ["contract.model.spec"]\n'
    )
    done = _lint(str(config))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "apps.catalog.services -> contract.model.spec" in done.stdout


def test_every_contract_module_loads_only_the_standard_library() -> None:
    """What the portal and the agents share imports nothing beyond Python itself: in a fresh interpreter,
    importing every module of ``contract`` adds only standard-library modules and ``contract``'s to
    ``sys.modules`` (what the interpreter loaded at startup, before, does not count)."""
    code = ("import importlib, pkgutil, sys\n"
            "before = set(sys.modules)\n"
            "import contract\n"
            "names = [m.name for m in pkgutil.walk_packages(contract.__path__, 'contract.')]\n"
            "for name in names: importlib.import_module(name)\n"
            "tops = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "print(len(names)); print(sorted(tops - set(sys.stdlib_module_names) - {'contract'}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    count, outside = done.stdout.split("\n")[:2]
    assert int(count) >= 20  # every module was imported, not only the package
    assert outside == "[]", outside
