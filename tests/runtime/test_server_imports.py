"""The runtime's modules import one another without cycles (imports inside functions included), so that
``engine/tp.py`` and ``server/launcher.py`` (and any other pair) never depend on each other both ways. A
package importing its own submodule to re-export it is not a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "agents" / "runtime"


def _import_graph() -> dict[str, set[str]]:
    files = {}
    for path in RUNTIME.rglob("*.py"):
        parts = path.relative_to(RUNTIME.parents[1]).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                own_submodule = target.startswith(name + ".")
                if target in files and target != name and not own_submodule:
                    graph[name].add(target)
    return graph


def _cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, if any (depth-first, iterative)."""
    stack = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycles_in_the_runtime():
    graph = _import_graph()
    assert "agents.runtime.engine.tp" in graph and "agents.runtime.server.launcher" in graph
    cycles = [c for c in (_cycle_from(graph, m) for m in sorted(graph)) if c]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])
