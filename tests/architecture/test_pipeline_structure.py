"""The pipeline's shape: no import cycle among its modules (import-linter's graph library, every import statement
counted, those inside functions and under ``TYPE_CHECKING`` included) and no module past the house's size."""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each a cycle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in edges:
        if module not in index:
            visit(module)
    return found


def test_the_pipeline_has_no_import_cycle() -> None:
    graph = grimp.build_graph("agents", cache_dir=None)
    modules = {m for m in graph.modules if m.startswith("agents.pipeline.") or m == "agents.pipeline"}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules} for m in modules}
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_ring() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_pipeline_module_is_past_the_house_size() -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "agents/pipeline").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
