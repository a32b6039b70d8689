"""The package's modules import each other without a circle.

The graph is read from the source with `ast` (nothing is imported), relative imports resolved
against the importing module. Which imports count, decided here:

- every import statement that runs: at module level *and* inside functions. A lazy import in a
  function is how a circle is usually hidden, not removed: the two modules still need each other.
- imports under `if TYPE_CHECKING:` never run, but a circle through them is still two modules
  that need each other's definitions; `test_no_type_only_circle` counts them too.
- not the implicit import of a parent package (`import a.b.c` also runs `a/b/__init__.py`): a
  package's `__init__` re-exporting its submodules is the usual layout, not a circle.

`from pkg import name` is an edge to `pkg.name` when that is a module of the package, else to
`pkg`. A circle is a strongly connected component of more than one module (or a module that
imports itself).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "mcp_durable"
PACKAGE = "mcp_durable"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_checking: bool) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if not type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path], type_checking: bool = False) -> set[str]:
    """The package modules `name` (at `path`) imports when it runs (`type_checking`: and for
    type checkers)."""
    is_package = path.name == "__init__.py"
    edges: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path)), type_checking):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base_parts = name.split(".")
                if not is_package:
                    base_parts = base_parts[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in modules else base)
        for target in targets:
            # `import a.b.c` binds `a` but runs `a.b.c`: the edge is to the deepest known module.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target in modules and target != name:
                edges.add(target)
            elif target == name:
                edges.add(name)
    return edges


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imports_of(name, path, modules, type_checking) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a circle (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
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
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(found)


def test_the_graph_is_read() -> None:
    """A sanity check of the walker itself, so an empty graph cannot pass as 'no circles'."""
    graph = import_graph()
    assert "mcp_durable.journal.model" in graph["mcp_durable.journal.base"]
    assert "mcp_durable.server.results" in graph["mcp_durable.server"]  # `from .results import …`
    assert "mcp_durable.journal.file.journal" in graph["mcp_durable.journal.file"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _shown(found: list[list[str]]) -> str:
    return "\n".join(" ↔ ".join(component) for component in found)


def test_no_import_circle() -> None:
    found = cycles(import_graph())
    assert found == [], "import circles among the package's modules:\n" + _shown(found)


def test_no_type_only_circle() -> None:
    found = cycles(import_graph(type_checking=True))
    assert found == [], "import circles (counting TYPE_CHECKING imports):\n" + _shown(found)
