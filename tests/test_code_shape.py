"""The package's shape: modules small enough to hold in one's head, no import cycles.

Function size and complexity are ruff's (``pyproject.toml``: C901, PLR0912, PLR0915); ruff
has no rule for a module's length, and none for cycles through imports made inside
functions, so these two are checked here. Imports under ``if TYPE_CHECKING:`` are for the
type checker only and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"
MAX_MODULE_LINES = 420


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, known: set[str]) -> set[str]:
    """autotune modules ``path`` imports at run time (module level or in functions)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {name for name in found if name in known}


def test_no_module_is_too_long() -> None:
    long = {
        name: lines
        for name, path in _modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: split them by concept"


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    # a package's __init__ re-exports its modules; importing the package is not a cycle back
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    cycles = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                walk(target, [*stack, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
