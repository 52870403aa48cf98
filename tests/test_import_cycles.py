"""No module of the packages imports, directly or through others, a module that imports it back: every
import statement counts, those inside functions too (a lazy import hides a cycle at import time, not from the
reader). Read from the sources, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autoshard", "strategies", "solver", "runtime", "service")


def module_imports() -> dict[str, set[str]]:
    """Each module of the packages -> the modules of the packages it imports (a package's ``__init__`` by the
    package's name)."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            imported: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
                elif isinstance(node, ast.Import):
                    imported |= {alias.name for alias in node.names}
            found[name] = {m for m in imported if m.split(".")[0] in PACKAGES and m != name}
    return {name: {m for m in imported if m in found} for name, imported in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = module_imports()
    assert {"runtime.planned_step", "runtime.plan_checks", "runtime.apply", "solver.solve"} <= set(graph)
    assert "runtime.plan_checks" in graph["runtime.planned_step"]
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
