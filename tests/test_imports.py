"""The package's layers, drawn from its imports (docs/design.md, "Layers").

Every module under ``topas/`` is parsed (not imported) and every ``import`` in it, at module level
or inside a function, is an arrow from that module to the module it names (``from pkg import sub``
names ``pkg.sub`` when ``sub`` is a module, else ``pkg``); an import under ``if TYPE_CHECKING:``
runs only for a type checker and is no arrow. The arrows must form no circle, neither between
modules nor between the package's parts (its sub-packages and top-level modules), every part must
import only parts of lower layers (:data:`LAYERS`), and the engine side of the house (``sglang``,
``engine``, ``policies``, ``cluster``, ``workload``) must not know the experiment layer. An import
inside a function says why it is there (a comment on its line or above its group: an optional
dependency such as SGLang, or an import slow enough to matter).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "topas"
#: Packages that must not import ``topas.experiments`` (engines are registered, not named).
BELOW_EXPERIMENTS = ("sglang", "engine", "policies", "cluster", "workload")
#: The parts of ``topas/``, lowest first: a part imports only parts of lower layers (docs/design.md).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("registry", "errors", "paths", "provenance", "sets", "out_dir", "cli_errors", "cli_options", "notebook_save"),
    ("workload",),
    ("engine",),
    ("policies",),
    ("cluster", "sglang"),
    ("engines",),
    ("experiments",),
    ("plots",),
    ("fidelity",),
    ("cli",),
)


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

    for node in _walk_runtime(tree):
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


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk_runtime(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (their ``else`` is kept)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, modules of the package only."""
    mods = modules(root)
    known = set(mods)
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        edges: dict[str, int] = {}
        for t, line in imports_of(name, path, known):
            edges[t] = min(line, edges.get(t, line))
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


def part(module: str) -> str:
    """The part of ``topas`` a module belongs to: its sub-package or top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """part -> {imported part: number of module arrows}, arrows inside one part left out."""
    out: dict[str, dict[str, int]] = {part(m): {} for m in graph}
    for m, edges in graph.items():
        for t in edges:
            a, b = part(m), part(t)
            if a != b:
                out[a][b] = out[a].get(b, 0) + 1
    return out


def arrows_between(graph: dict[str, dict[str, int]], a: str, b: str) -> list[str]:
    mods = modules()
    return [f"{mods[m].relative_to(PACKAGE.parent)}:{line} imports {t}" for m, edges in sorted(graph.items())
            if part(m) == a for t, line in sorted(edges.items()) if part(t) == b]


def test_type_checking_imports_are_no_arrows_and_parts_are_drawn(tmp_path):
    pkg = tmp_path / "topas"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    for f in ("__init__.py", "low/__init__.py", "high/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "low" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from topas.high import b\n"
                                     "else:\n    import topas.tool\n")
    (pkg / "high" / "b.py").write_text("def f():\n    from topas.low import a\n")
    (pkg / "tool.py").write_text("")
    g = import_graph(pkg)
    assert g["topas.low.a"] == {"topas.tool": 5} and g["topas.high.b"] == {"topas.low.a": 2}
    assert package_graph(g) == {"topas": {}, "low": {"tool": 1}, "high": {"low": 1}, "tool": {}}
    (pkg / "low" / "a.py").write_text("import topas.high.b\n")
    pg = package_graph(import_graph(pkg))
    assert circles(pg) == [["high", "low"]] and describe(cycle_in(["high", "low"], pg), pg) == (
        "high (line 1) -> low (line 1) -> high")


def test_no_import_circle_between_the_parts_of_the_package():
    graph = import_graph()
    pg = package_graph(graph)
    found = circles(pg)
    assert not found, "import circles between parts of topas/ (sub-packages, top-level modules):\n" + "\n".join(
        f"  {' -> '.join(cycle_in(c, pg))}\n    " + "\n    ".join(
            arrow for a, b in zip(cycle_in(c, pg), cycle_in(c, pg)[1:]) for arrow in arrows_between(graph, a, b)[:3])
        for c in found)


def test_every_part_imports_only_lower_layers():
    graph = import_graph()
    layer = {p: i for i, names in enumerate(LAYERS) for p in names}
    pg = package_graph(graph)
    unplaced = sorted(set(pg) - set(layer) - {"topas"})
    assert not unplaced, f"parts of topas/ with no layer in tests/test_imports.py LAYERS: {unplaced}"
    bad = [arrow for a, targets in sorted(pg.items()) if a != "topas" for b in sorted(targets)
           if layer[b] >= layer[a] for arrow in arrows_between(graph, a, b)]
    assert not bad, "imports of a part of the same or a higher layer (docs/design.md, Layers):\n  " + "\n  ".join(bad)


def unexplained_lazy_imports(path: Path) -> list[int]:
    """Lines of function-level imports with no comment on their line nor above their group."""
    lines = path.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(lines))
    found: list[ast.stmt] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    ends = {n.end_lineno for n in found}
    bad = []
    for n in sorted(found, key=lambda n: n.lineno):
        first = n.lineno
        while first - 1 in ends:  # the group of imports this one continues
            first = next(m.lineno for m in found if m.end_lineno == first - 1)
        group = range(first, n.end_lineno + 1)
        if any("#" in lines[i - 1] for i in group) or (first > 1 and lines[first - 2].strip().startswith("#")):
            continue
        bad.append(n.lineno)
    return bad


def test_every_import_inside_a_function_says_why():
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in modules().values()
           for line in unexplained_lazy_imports(path)]
    assert not bad, ("imports inside functions without a comment saying why (an optional dependency, a slow "
                     "import; anything else goes at the top):\n  " + "\n  ".join(bad))


def test_a_lazy_import_is_explained_by_a_comment_on_its_group(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    # lazy: optional\n    import a\n    import b\n\n    import c  # lazy: slow\n    import d\n"
                 "    if TYPE_CHECKING:\n        import e\n")
    assert unexplained_lazy_imports(f) == []
    f.write_text("def f():\n    x = 1\n    import a\n    import b\n")
    assert unexplained_lazy_imports(f) == [3, 4]


#: The longest a module of the library may be (docs/design.md, "Layers"): a reader takes in one module
#: at a time, and a longer one is two jobs.
MAX_MODULE_LINES = 500


def test_no_module_of_the_library_is_over_500_lines():
    long = {f"{path.relative_to(PACKAGE.parent)}": n for path in modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"
