"""The rules the tree keeps, read from its source: the dashboard reads the store through its API only,
comments cite documents that exist, no import cycle, and function-local project imports say what they
defer. The tools (ruff, import-linter's contracts, mypy strict) run in `.ci/run`, not here."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT


def test_the_tui_reads_the_store_through_its_api_only() -> None:
    """Views get frozen dataclasses from store.Store, never ORM rows or SQL (the house style: harlequin, MLflow)."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tui").rglob("*.py")
        if "sqlalchemy" in path.read_text() or "store.models" in path.read_text()
    ]
    assert offenders == []


def test_comments_cite_only_documents_in_the_project() -> None:
    """What the code relies on is written in the project (docs/), so every .md a comment names exists here."""
    missing = []
    for path in [*(ROOT / "runner").rglob("*.py"), *(ROOT / "store").rglob("*.py"), *(ROOT / "tui").rglob("*.py")]:
        for name in re.findall(r"([\w./-]+\.md)\b", path.read_text()):
            candidates = [ROOT / name, ROOT / "docs" / name, ROOT / "docs" / name.removeprefix("docs/")]
            if not any(c.is_file() for c in candidates):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []


# ---------------------------------------------------------------------- the import graph

PACKAGES = ("runner", "store", "tui")
DEFERRED_FOR = ("torch", "transformers", "accelerate", "deepspeed", "peft", "datasets", "textual", "pydantic",
                "plotext")
"""What a function-local import of the project's own modules may defer: a heavy library it pulls in, or the
Textual app. Its comment names one: ``# deferred: torch``. ``pydantic`` (the recipe models, 0.2-0.45 s with
what imports them) and ``plotext`` (the dashboard's plots) are deferred by the Textual app so that its first
paint, the Runs screen, waits for neither (docs/architecture.md, "What the dashboard's first paint costs")."""


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    file: str
    line: int
    local: bool
    """Inside a function (runs on call, not on import)."""


def _modules() -> dict[str, Path]:
    """Every module of the project's packages by dotted name (a package is its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it is inside a function; those under ``if TYPE_CHECKING:`` are
    left out (they never run)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, local)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, local))
        inner = local or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def _import_graph() -> list[Edge]:
    """The project's imports of its own modules: every ``import`` and ``from ... import`` anywhere in a
    module (function-local ones included, relative ones resolved), ``from pkg import mod`` counted as an
    import of ``pkg.mod``. Imports under ``if TYPE_CHECKING:`` are not counted: they never run."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node, local in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [owner(alias.name) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else owner(base) for a in node.names]
            for target in dict.fromkeys(targets):
                if target is not None and target != name:
                    edges.append(Edge(name, target, str(path.relative_to(ROOT)), node.lineno, local))
    return edges


def _components(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, list[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                components.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(components)


def _shortest_cycle(start: str, members: set[str], edges: list[Edge]) -> list[Edge]:
    """The shortest way from ``start`` back to itself through ``members`` (breadth first)."""
    paths: dict[str, list[Edge]] = {start: []}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for edge in edges:
            if edge.source != node:
                continue
            if edge.target == start:
                return [*paths[node], edge]
            if edge.target in members and edge.target not in paths:
                paths[edge.target] = [*paths[node], edge]
                queue.append(edge.target)
    raise AssertionError(f"{start} is on no cycle")


def test_no_import_cycle() -> None:
    """No module of runner, store or tui reaches itself through the imports it runs (top-level and
    function-local alike; imports under ``if TYPE_CHECKING:`` never run, so they are not counted). A
    package's ``__init__`` importing its submodules while one of them imports the package is a cycle too.
    Each tangle (strongly connected component) is printed with its modules and its shortest cycle."""
    edges = _import_graph()
    report = []
    for component in _components(edges):
        cycle = _shortest_cycle(component[0], set(component), edges)
        path = " -> ".join([component[0], *(f"{e.target} ({e.file}:{e.line}{', local' if e.local else ''})"
                                             for e in cycle)])
        report.append(f"{len(component)} modules: {', '.join(component)}\n  {path}")
    if report:
        pytest.fail(f"{len(report)} import cycle(s):\n" + "\n".join(report), pytrace=False)


def test_local_imports_of_the_project_say_what_they_defer() -> None:
    """A function-local import of the project's own modules hides a dependency from the reader and from
    the import graph's layers, so it is allowed only to defer a heavy library or the Textual app, and says
    which on its line or the line above: ``# deferred: torch`` (one of :data:`DEFERRED_FOR`)."""
    pattern = re.compile(r"#.*\bdeferred: (\w+)")
    lines: dict[str, list[str]] = {}
    unexplained = []
    for edge in _import_graph():
        if not edge.local:
            continue
        text = lines.setdefault(edge.file, (ROOT / edge.file).read_text().splitlines())
        said = [m.group(1) for line in text[max(0, edge.line - 2): edge.line] if (m := pattern.search(line))]
        if not any(reason in DEFERRED_FOR for reason in said):
            unexplained.append(f"{edge.file}:{edge.line}: {edge.source} -> {edge.target}")
    if unexplained:
        pytest.fail(f"{len(unexplained)} function-local import(s) of the project without "
                    f"'# deferred: <{'|'.join(DEFERRED_FOR)}>':\n" + "\n".join(sorted(unexplained)), pytrace=False)


def test_the_graph_reader_sees_local_imports_skips_type_checking_and_finds_cycles() -> None:
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\ndef f():\n    from d import e\n")
    assert [(type(n).__name__, n.lineno, local) for n, local in _imports(tree)] == [
        ("Import", 1, False), ("Import", 5, False), ("ImportFrom", 7, True)]
    edges = [Edge("p", "p.m", "p/__init__.py", 1, False), Edge("p.m", "p", "p/m.py", 3, True),
             Edge("p.m", "q", "p/m.py", 4, False)]
    assert _components(edges) == [["p", "p.m"]]
    assert _shortest_cycle("p", {"p", "p.m"}, edges) == edges[:2]
