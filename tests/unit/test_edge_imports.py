"""The edge's modules import each other one way: no cycle, counting imports made only
for type checking and imports inside functions; adapters never import the shell."""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import ROOT, imported, module_name

EDGE = ROOT / "edge"


def edge_imports(path: Path, modules: set[str]) -> set[str]:
    """Every edge module `path` imports, wherever the import statement is."""
    return imported(path) & modules


def graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in EDGE.rglob("*.py")}
    modules = set(paths)
    # a package's __init__ only loads the native modules; an import of a submodule
    # ("from edge.core import balance") names the submodule itself
    return {name: edge_imports(path, modules) - {name} - {"edge", "edge.core", "edge.adapters"}
            for name, path in paths.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_checker_finds_a_cycle_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_checker_sees_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from edge.service import Edge\n"
                      "def f():\n    import edge.view\n")
    assert edge_imports(source, {"edge.service", "edge.view"}) == {"edge.service", "edge.view"}


def test_there_is_no_import_cycle_in_the_edge() -> None:
    edges = graph()
    assert "edge.service" in edges and "edge.adapters.http1" in edges
    assert find_cycle(edges) is None, f"import cycle: {' -> '.join(find_cycle(edges) or [])}"


def test_the_pure_core_imports_nothing_of_the_shell_and_adapters_not_the_shell() -> None:
    edges = graph()
    for name, imports in edges.items():
        if name.startswith("edge.core."):
            assert all(i.startswith("edge.core.") for i in imports), (name, imports)
        if name.startswith("edge.adapters."):
            assert "edge.service" not in imports, name
