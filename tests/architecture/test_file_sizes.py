"""The house's size rule: no tracked source file of the project (.py, .c, .h, .html, .js) past about 400 lines,
except generated migrations and vendored or installed third-party files."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400
SUFFIXES = (".py", ".c", ".h", ".html", ".js")


def _skipped(path: str) -> bool:
    return "/migrations/" in f"/{path}" or path.startswith("frontend/node_modules/") or "static/vendor/" in path


def project_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in listed.stdout.split("\0") if p.endswith(SUFFIXES) and not _skipped(p) and (ROOT / p).is_file()]


def test_no_project_file_is_past_the_house_size() -> None:
    files = project_files()
    assert any(p.startswith("apps/") for p in files) and any(p.endswith(".c") for p in files)
    long = {p: n for p in files if (n := len((ROOT / p).read_text(errors="replace").splitlines())) > MAX_LINES}
    assert long == {}


def test_migrations_and_vendored_files_are_the_only_exceptions() -> None:
    assert _skipped("apps/evidence/migrations/0004_verdicts.py") and _skipped("frontend/node_modules/x/index.js")
    assert _skipped("day0portal/static/vendor/htmx.min.js")
    assert not _skipped("apps/evidence/services.py") and not _skipped("agents/runtime/kernels/csrc/attention.c")
