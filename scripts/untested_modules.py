#!/usr/bin/env python3
"""Lists the source modules no test module imports directly, and counts them.

Source: every module of ``agents``, ``apps``, ``day0portal``, ``day0cli`` and ``contract`` (those present), migrations
left out (generated), and a package's ``__init__`` only when it holds more than a docstring and imports. A test
module is any ``.py`` under ``tests/`` (helpers and conftest files included). A module counts as imported when an
import statement of a test module names it: ``import a.b``, ``from a.b import c`` (``a.b``, and ``a.b.c`` when
that is a module), anywhere in the file (inside functions too); read with ``ast``, nothing is run. A module
only started as a process (``python -m …``) or reached through another module does not count.

    python scripts/untested_modules.py [--root DIR] [--quiet]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_PACKAGES = ("agents", "apps", "day0portal", "day0cli", "contract")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def has_behaviour(tree: ast.Module) -> bool:
    """More than a docstring, ``from __future__`` and imports (a package's ``__init__`` that only re-exports)."""
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            continue
        return True
    return False


def source_modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every source module that may hold behaviour."""
    found: dict[str, Path] = {}
    for package in SOURCE_PACKAGES:
        if not (root / package).is_dir():
            continue
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.relative_to(root).parts:
                continue
            if path.name == "__init__.py" and not has_behaviour(ast.parse(path.read_text(), str(path))):
                continue
            found[module_name(path, root)] = path
    return found


def imported_names(path: Path) -> set[str]:
    """Every module name an import statement of ``path`` names (``from a import b``: ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def untested(root: Path) -> tuple[list[str], int]:
    """(the source modules no test imports, sorted; how many source modules there are)."""
    modules = source_modules(root)
    imported: set[str] = set()
    for path in sorted((root / "tests").rglob("*.py")):
        imported |= imported_names(path)
    return sorted(name for name in modules if name not in imported), len(modules)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this checkout)")
    parser.add_argument("--quiet", action="store_true", help="print the count only")
    args = parser.parse_args(argv)
    names, total = untested(args.root)
    if not args.quiet:
        for name in names:
            print(name)
    print(f"{len(names)} of {total} source modules are imported by no test module")
    return 0


if __name__ == "__main__":
    sys.exit(main())
