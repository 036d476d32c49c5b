"""No import cycle in the tree: among the modules of each top-level package, and across them. The graph is
import-linter's own (grimp), of every import statement: those inside functions and under ``TYPE_CHECKING``
included, so a cycle cannot hide in a function-level import."""

from __future__ import annotations

from pathlib import Path

import grimp

PACKAGES = ("agents", "apps", "contract", "telemetry", "day0portal", "day0cli")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each a cycle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return sorted(found)


def _edges(graph: grimp.ImportGraph, modules: set[str]) -> dict[str, set[str]]:
    return {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules} for m in modules}


def test_no_package_has_an_import_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None, exclude_type_checking_imports=False)
    found = {}
    for package in PACKAGES:
        modules = {m for m in graph.modules if m == package or m.startswith(f"{package}.")}
        assert len(modules) > 1 or package == "telemetry", package  # the graph holds the package's modules
        if rings := cycles(_edges(graph, modules)):
            found[package] = rings
    assert found == {}
    project = {m for m in graph.modules if m.split(".")[0] in PACKAGES}
    assert cycles(_edges(graph, project)) == []


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path, monkeypatch) -> None:
    """The graph the test reads holds a function-level import: a ring closed only inside a function is found."""
    package = tmp_path / "ringpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def later():\n    from ringpkg import high\n    return high\n")
    (package / "high.py").write_text("from ringpkg import low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("ringpkg", cache_dir=None)
    assert cycles(_edges(graph, set(graph.modules))) == [["ringpkg.high", "ringpkg.low"]]


def test_the_cycle_finder_finds_rings() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
