"""The package's layers, drawn from its imports (docs/design.md, "Layers").

Every module under ``topas/`` is parsed (not imported) and every ``import`` in it, at module
level, inside a function or under ``TYPE_CHECKING``, is an arrow from that module to the module it
names (``from pkg import sub`` names ``pkg.sub`` when ``sub`` is a module, else ``pkg``). The
arrows must form no circle, and the engine side of the house (``sglang``, ``engine``,
``policies``, ``cluster``, ``workload``) must not know the experiment layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "topas"
#: Packages that must not import ``topas.experiments`` (engines are registered, not named).
BELOW_EXPERIMENTS = ("sglang", "engine", "policies", "cluster", "workload")


def module_name(path: Path, root: Path = PACKAGE) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported module inside the package, line) for every import statement of one module."""
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[str, int]] = []

    def target(mod: str) -> str | None:
        # the longest known module that ``mod`` names (``topas.engine.cost.X`` -> ``topas.engine.cost``)
        parts = mod.split(".")
        while parts:
            cand = ".".join(parts)
            if cand in known:
                return cand
            parts.pop()
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                t = target(a.name)
                if t:
                    out.append((t, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                t = sub if sub in known else target(mod)
                if t:
                    out.append((t, node.lineno))
    # A module importing its own package (``topas.policies.base`` loading ``topas.policies`` to
    # register the built-ins) names a module Python has begun importing before it: no arrow.
    return [(t, line) for t, line in out if t != name and not name.startswith(t + ".")]


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, modules of the package only."""
    mods = modules(root)
    known = set(mods)
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        edges: dict[str, int] = {}
        for t, line in imports_of(name, path, known):
            edges.setdefault(t, line)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def cycle_in(comp: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """One closed path through a strongly connected component, for the message."""
    members = set(comp)
    start = comp[0]
    # breadth-first from start back to start inside the component
    prev: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph[v]:
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp  # pragma: no cover


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "topas"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from .x import f\n")
    (pkg / "a" / "x.py").write_text("def f():\n    from topas.b import g\n    return g\n")
    (pkg / "b.py").write_text("from topas.a import x\n")
    g = import_graph(pkg)
    assert g["topas.a"] == {"topas.a.x": 1}
    assert g["topas.a.x"] == {"topas.b": 2}
    assert g["topas.b"] == {"topas.a.x": 1}
    assert circles(g) == [["topas.a.x", "topas.b"]]
    assert describe(cycle_in(["topas.a.x", "topas.b"], g), g) == (
        "topas.a.x (line 2) -> topas.b (line 1) -> topas.a.x")


def test_no_import_circle_inside_the_package():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles inside topas/:\n" + "\n".join(
        f"  {', '.join(c)}\n    e.g. {describe(cycle_in(c, graph), graph)}" for c in found)


@pytest.mark.parametrize("package", BELOW_EXPERIMENTS)
def test_engines_policies_and_workload_do_not_know_the_experiment_layer(package):
    graph = import_graph()
    mods = modules()
    bad = [f"{mods[m].relative_to(PACKAGE.parent)}:{line} imports {t}"
           for m, edges in sorted(graph.items()) if m == f"topas.{package}" or m.startswith(f"topas.{package}.")
           for t, line in sorted(edges.items()) if t == "topas.experiments" or t.startswith("topas.experiments.")]
    assert not bad, f"topas/{package} imports the experiment layer:\n  " + "\n  ".join(bad)


# ----------------------------------------------------------------------------- library, studies, pipeline

#: Top-level packages beside the library (docs/design.md, "Architecture"): the library imports neither.
NOT_LIBRARY = ("studies", "pipeline")


def names_imported(path: Path) -> list[tuple[str, int]]:
    """(module named, line) for every import of one file: at module level, inside a function or a
    class, under ``TYPE_CHECKING``; relative imports resolved against ``topas``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # inside topas/, a relative import stays inside topas/
                continue
            out += [(node.module or "", node.lineno)]
    return out


def test_names_imported_sees_function_level_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef f():\n    from studies.claims import grid\n    import pipeline.reproduce\n")
    assert names_imported(f) == [("os", 1), ("studies.claims", 4), ("pipeline.reproduce", 5)]


def test_the_library_imports_no_study_and_not_the_pipeline():
    """Nothing under topas/ imports ``studies`` or ``pipeline``, function-level imports included:
    the library is what a study builds on, never the other way round."""
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {mod}"
           for path in modules().values() for mod, line in names_imported(path)
           if mod.split(".")[0] in NOT_LIBRARY]
    assert not bad, "the library imports a study or the pipeline:\n  " + "\n  ".join(bad)


def test_the_studies_do_not_import_the_pipeline():
    root = PACKAGE.parent / "studies"
    bad = [f"{path.relative_to(root.parent)}:{line} imports {mod}"
           for path in sorted(root.rglob("*.py")) for mod, line in names_imported(path)
           if mod.split(".")[0] == "pipeline"]
    assert not bad, "a study imports the pipeline:\n  " + "\n  ".join(bad)
