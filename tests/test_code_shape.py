"""The code's shape: modules and functions small enough to hold in one's head, no import
cycles, in the package and in the benchmark scripts.

Ruff (``pyproject.toml``: C901, PLR0912, PLR0915) bounds a function's complexity and
statements; it has no rule for a function's or a module's length in lines, and none for
cycles through imports made inside functions, so these are checked here. Imports under
``if TYPE_CHECKING:`` are for the type checker only and are not counted.

The package's modules are named by their dotted path (``autotune.run._resolved_run``) and may import
each other relatively (``from . import x``). Most benchmarks are scripts in one folder
per tool, run as ``python benchmarks/TOOL/x.py``; they put the repository root on
``sys.path`` and import each other as the package ``benchmarks`` (``from
benchmarks.search_efficiency.search_efficiency_table import ...``), named here by their
path under benchmarks/ (``search_efficiency.search_efficiency_table``). The GPU check is a
package in that folder (``gpu_check.report``, relative imports inside).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60


@dataclass(frozen=True)
class Tree:
    """Python files under ``folder``, named for import as seen from ``import_root``."""

    folder: Path
    import_root: Path  # the folder on sys.path: a module's name is its path from here
    package: str = ""  # the folder also imported as this package: ``package.x`` is ``x``


PACKAGE = Tree(ROOT / "autotune", import_root=ROOT)
BENCHMARKS = Tree(ROOT / "benchmarks", import_root=ROOT / "benchmarks", package="benchmarks")
TREES = [pytest.param(PACKAGE, id="autotune"), pytest.param(BENCHMARKS, id="benchmarks")]


def modules(tree: Tree) -> dict[str, Path]:
    """Each module's import name and file (a package is its ``__init__.py``)."""
    found = {}
    for path in sorted(tree.folder.rglob("*.py")):
        parts = path.relative_to(tree.import_root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name or tree.package] = path  # the import root's own __init__: the package
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _from_module(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The absolute module a ``from ... import`` names; relative ones resolve against the
    package of module ``name`` (a package's ``__init__`` is its own package)."""
    if node.level == 0:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports(
    path: Path, name: str, known: set[str], package: str = "", *, type_only_too: bool = False
) -> set[str]:
    """Modules in ``known`` that module ``name`` (file ``path``) imports at run time, at
    module level or in functions (and under ``if TYPE_CHECKING:`` with ``type_only_too``);
    ``package.x`` counts as ``x`` (see :class:`Tree`)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_only_too:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, name, path)
            found.add(module)
            found.update(".".join(filter(None, [module, a.name])) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    if package:
        found = {m.removeprefix(package + ".") for m in found}
    return {module for module in found if module in known}


def import_cycles(tree: Tree) -> list[list[str]]:
    """Every cycle among the tree's run-time imports, each as the modules along it."""
    found = modules(tree)
    graph = {
        name: imports(path, name, set(found), tree.package) - {name} for name, path in found.items()
    }
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
    return cycles


def long_functions(tree: Tree, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions and methods (sync or async, nested ones too) over ``limit`` physical
    lines, from the ``def`` line through the last line, as ``file:line name (N lines)``."""
    found = []
    for path in modules(tree).values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    where = f"{path.relative_to(tree.folder.parent)}:{node.lineno}"
                    found.append(f"{where} {node.name} ({lines} lines)")
    return found


@pytest.mark.parametrize("tree", TREES)
def test_no_function_is_too_long(tree: Tree) -> None:
    long = long_functions(tree)
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines, split them: " + "; ".join(long)


def objective_comparisons(tree: Tree) -> list[str]:
    """Comparisons of a ``.objective`` with an objective's name (``goal.objective ==
    "cost"``) outside ``training_goal.py``: the goal ranks by its objective, code elsewhere
    asks the goal (``ranks_by_speed_alone``, ``tier_of``, ``noun``, ...)."""
    from autotune.training_goal import OBJECTIVES

    found = []
    for path in modules(tree).values():
        if path.name == "training_goal.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            named = any(isinstance(x, ast.Attribute) and x.attr == "objective" for x in sides)
            literal = any(isinstance(x, ast.Constant) and x.value in OBJECTIVES for x in sides)
            if named and literal:
                found.append(f"{path.relative_to(tree.folder.parent)}:{node.lineno}")
    return found


@pytest.mark.parametrize("tree", TREES)
def test_only_the_training_goal_compares_objectives(tree: Tree) -> None:
    found = objective_comparisons(tree)
    assert found == [], "ask the TrainingGoal instead of comparing its objective: " + ", ".join(
        found
    )


def test_an_objective_compared_by_name_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path / "pkg",
        {
            "a.py": 'def f(goal):\n    return goal.objective == "cost"\n',
            "b.py": "def f(goal):\n    return goal.ranks_by_speed_alone\n",
            "training_goal.py": 'def f(self):\n    return self.objective != "deadline"\n',
        },
    )
    tree = Tree(tmp_path / "pkg", import_root=tmp_path)
    assert objective_comparisons(tree) == [str(Path("pkg/a.py")) + ":2"]


@pytest.mark.parametrize("tree", TREES)
def test_no_import_cycle(tree: Tree) -> None:
    cycles = import_cycles(tree)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# The checks themselves, on small trees written for them.


def _write(folder: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _function(name: str, lines: int, indent: str = "", *, prefix: str = "def") -> str:
    """A function of exactly ``lines`` physical lines."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}{prefix} {name}():\n{body}{indent}    return None\n"


def test_long_functions_are_found_with_file_line_and_length(tmp_path: Path) -> None:
    _write(
        tmp_path / "scripts",
        {
            "ok.py": _function("fits", MAX_FUNCTION_LINES),
            "bad.py": "import os\n\n"
            + _function("too_long", MAX_FUNCTION_LINES + 1)
            + "class C:\n"
            + _function("method", MAX_FUNCTION_LINES + 2, "    ", prefix="async def"),
        },
    )
    found = long_functions(Tree(tmp_path / "scripts", import_root=tmp_path / "scripts"))
    assert sorted(found) == [
        f"scripts/bad.py:3 too_long ({MAX_FUNCTION_LINES + 1} lines)",
        f"scripts/bad.py:{MAX_FUNCTION_LINES + 5} method ({MAX_FUNCTION_LINES + 2} lines)",
    ]


def test_script_cycles_through_bare_module_names(tmp_path: Path) -> None:
    """Scripts importing each other by file name, in a function too; a script importing
    itself (its ``__main__`` reaching its own globals) and ``TYPE_CHECKING`` imports are
    not cycles."""
    scripts = tmp_path / "scripts"
    _write(
        scripts,
        {
            "a.py": "import b\nimport a\n",
            "b.py": "def run():\n    from c import thing\n",
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n",
        },
    )
    tree = Tree(scripts, import_root=scripts)
    assert import_cycles(tree) == []
    _write(scripts, {"c.py": "import os\nfrom a import x\n"})
    assert import_cycles(tree) == [["a", "b", "c", "a"]]


def test_script_cycles_through_the_folder_as_a_package(tmp_path: Path) -> None:
    """Scripts importing each other as ``scripts.x`` (the folder as a package, its parent on
    ``sys.path``) and by file name are one graph; the folder's ``__init__`` is the package."""
    scripts = tmp_path / "scripts"
    _write(
        scripts,
        {
            "__init__.py": "",
            "a.py": "from scripts.b import f\n",
            "b.py": "from scripts import c\n",
            "c.py": "import a\n",
        },
    )
    tree = Tree(scripts, import_root=scripts, package="scripts")
    assert set(modules(tree)) == {"scripts", "a", "b", "c"}
    assert import_cycles(tree) == [["a", "b", "c", "a"]]


_CYCLE_A_B = [["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]]


@pytest.mark.parametrize(
    ("files", "cycles"),
    [
        ({"pkg/sub/a.py": "from . import b"}, _CYCLE_A_B),
        ({"pkg/sub/a.py": "from .b import f"}, _CYCLE_A_B),
        ({"pkg/sub/a.py": "from ..sub.b import f"}, _CYCLE_A_B),
        ({"pkg/sub/a.py": "import pkg.sub.b"}, _CYCLE_A_B),
        ({"pkg/sub/a.py": "from . import c"}, []),
        (
            {"pkg/sub/__init__.py": "from ..other import y", "pkg/other.py": "import pkg.sub"},
            [["pkg.other", "pkg.sub", "pkg.other"]],
        ),
    ],
    ids=["from-dot", "from-dot-module", "from-parent", "absolute", "no-cycle", "init"],
)
def test_package_cycles_through_relative_imports(
    tmp_path: Path, files: dict[str, str], cycles: list[list[str]]
) -> None:
    """Relative imports resolve against the importer's package (an ``__init__`` is its own
    package); a module importing its own package (which re-exports it) is no cycle."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/sub/a.py": "",
            "pkg/sub/b.py": "def f():\n    from pkg.sub import a\n",
            "pkg/sub/c.py": "",
        },
    )
    _write(tmp_path, {path: text + "\n" for path, text in files.items()})
    assert import_cycles(Tree(tmp_path / "pkg", import_root=tmp_path)) == cycles


# The package order: a package imports only packages below it. The order is docs/design.md's
# map (its package table, top to bottom); the top-level modules are the bottom layer and
# ``autotune/__init__.py``, the public face, may name any package.

DESIGN = ROOT / "docs" / "design.md"


def package_order(design: Path = DESIGN) -> list[str]:
    """The packages of docs/design.md's map, top to bottom (rows `` | `cli/` | ... | ``)."""
    order = []
    for line in design.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and cells[0].startswith("`") and cells[0].endswith("/`"):
            order.append(cells[0].strip("`/").replace("/", "."))
    return order


def _layer(module: str, root: str, order: list[str]) -> int | None:
    """The layer of ``module`` (0 is the top); top-level modules are the bottom layer; None
    for the root package itself (the public face) and for modules outside the root."""
    parts = module.split(".")
    if parts[0] != root or len(parts) == 1:
        return None
    for index, package in enumerate(order):
        if module == f"{root}.{package}" or module.startswith(f"{root}.{package}."):
            return index
    return len(order)


def upward_imports(tree: Tree, order: list[str], *, type_only_too: bool = True) -> list[str]:
    """Imports of a module from a package above its own, as ``importer -> imported``. Type
    checking imports count too: an annotation that names an upper layer's type is a
    dependency on it all the same."""
    found = modules(tree)
    root = tree.folder.name
    upward = []
    for name, path in sorted(found.items()):
        layer = _layer(name, root, order)
        if layer is None:
            continue
        for target in sorted(imports(path, name, set(found), type_only_too=type_only_too)):
            target_layer = _layer(target, root, order)
            if target_layer is not None and target_layer < layer:
                upward.append(f"{name} -> {target}")
    return upward


def _package_of(module: str, tree: Tree) -> str:
    """The package a module belongs to (a package's ``__init__`` is its own)."""
    found = modules(tree)
    path = found[module]
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def private_imports(tree: Tree) -> list[str]:
    """Imports that reach a private module (``_name``) or a private name of another package,
    as ``importer -> imported``. A private part belongs to the package that holds it: a
    private module to its package, a private name to its module's package."""
    found = modules(tree)
    root = tree.folder.name

    def owner(dotted: str) -> str | None:
        parts = dotted.split(".")
        private = [i for i, part in enumerate(parts) if part.startswith("_")]
        if parts[0] != root or not private:
            return None
        holder = ".".join(parts[: private[0]])
        is_package = holder in found and found[holder].name == "__init__.py"
        return holder if is_package or holder not in found else holder.rsplit(".", 1)[0]

    crossing = []
    for name, path in sorted(found.items()):
        package = _package_of(name, tree)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _from_module(node, name, path)
            targets = [source] if owner(source) else [f"{source}.{a.name}" for a in node.names]
            for target in targets:
                held_by = owner(target)
                if held_by and not (package == held_by or package.startswith(held_by + ".")):
                    crossing.append(f"{name} -> {target}")
    return sorted(set(crossing))


def test_design_names_every_package_once() -> None:
    order = package_order()
    on_disk = sorted(
        path.parent.relative_to(PACKAGE.folder).as_posix().replace("/", ".")
        for path in PACKAGE.folder.glob("*/__init__.py")
    )
    assert sorted(order) == on_disk, "docs/design.md's package table and autotune/ disagree"


def test_packages_import_only_packages_below() -> None:
    upward = upward_imports(PACKAGE, package_order())
    assert upward == [], "imports against docs/design.md's package order: " + "; ".join(upward)


def private_package_imports(tree: Tree, package: str = "autotune") -> list[str]:
    """Imports of ``package``'s private modules or names from a tree outside it (the
    benchmarks), as ``importer -> imported``."""
    crossing = []
    for name, path in sorted(modules(tree).items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package:
                for target in [node.module] + [f"{node.module}.{a.name}" for a in node.names]:
                    if any(part.startswith("_") for part in target.split(".")):
                        crossing.append(f"{name} -> {target}")
                        break
    return crossing


@pytest.mark.parametrize("tree", TREES)
def test_no_private_module_or_name_crosses_a_package(tree: Tree) -> None:
    crossing = private_imports(tree)
    if tree is BENCHMARKS:
        crossing += private_package_imports(tree)
    assert crossing == [], "private modules or names used across packages: " + "; ".join(crossing)


_LAYERED = {
    "pkg/__init__.py": "from pkg.top import a\n",
    "pkg/top/__init__.py": "from pkg.top._a import f\n",
    "pkg/top/_a.py": "from pkg.low import g\ndef f():\n    from pkg import base\n",
    "pkg/low/__init__.py": "from pkg.low._g import g\n",
    "pkg/low/_g.py": "from pkg.base import h\n",
    "pkg/base.py": "h = 1\n",
}


@pytest.mark.parametrize(
    ("extra", "upward"),
    [
        ({}, []),
        ({"pkg/low/_g.py": "def g():\n    from pkg.top import f\n"}, ["pkg.low._g -> pkg.top"]),
        (
            {
                "pkg/low/_g.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from pkg.top._a import f\n"
            },
            ["pkg.low._g -> pkg.top._a"],
        ),
        ({"pkg/base.py": "from pkg.low import g\n"}, ["pkg.base -> pkg.low"]),
    ],
    ids=["in-order", "upward-in-function", "upward-type-only", "top-level-upward"],
)
def test_upward_imports_are_found(tmp_path: Path, extra: dict[str, str], upward: list[str]) -> None:
    """The order check sees an import of an upper package from a lower one, inside a
    function or for type checking only, and from a top-level module (the bottom layer)."""
    _write(tmp_path, {**_LAYERED, **extra})
    assert upward_imports(Tree(tmp_path / "pkg", tmp_path), ["top", "low"]) == upward


@pytest.mark.parametrize(
    ("extra", "crossing"),
    [
        ({}, []),
        ({"pkg/top/_a.py": "from pkg.low._g import g\n"}, ["pkg.top._a -> pkg.low._g"]),
        ({"pkg/top/_a.py": "from pkg.low import _hidden\n"}, ["pkg.top._a -> pkg.low._hidden"]),
        ({"pkg/top/_b.py": "from pkg.top._a import f\nfrom ._a import _x\n"}, []),
        (
            {"pkg/low/_h.py": "from pkg.low._g import _y\nfrom pkg.top import _a\n"},
            ["pkg.low._h -> pkg.top._a"],
        ),
    ],
    ids=["public", "private-module", "private-name", "inside-the-package", "module-by-name"],
)
def test_private_imports_across_packages_are_found(
    tmp_path: Path, extra: dict[str, str], crossing: list[str]
) -> None:
    _write(tmp_path, {**_LAYERED, **extra})
    assert private_imports(Tree(tmp_path / "pkg", tmp_path)) == crossing


def test_design_table_is_read_in_order(tmp_path: Path) -> None:
    design = tmp_path / "design.md"
    design.write_text(
        "| package | job |\n| --- | --- |\n| `cli/` | a |\n| `backends/deepspeed/` | b |\n"
        "| `errors.py` | c |\n",
        encoding="utf-8",
    )
    assert package_order(design) == ["cli", "backends.deepspeed"]


# Records that declare settings, each setting in one of them. A field of another record
# that holds a setting resolved (the study's config) names it with ``SetBy("setting")``
# in its annotation: a view of the one declaration, not a second one.
SETTINGS_RECORDS = [
    ("settings.py", "RunSettings"),
    ("training_goal.py", "TrainingGoal"),
    ("cli/_flags.py", "CommandFlags"),
    ("study/storage.py", "StudyConfig"),
]
# Records a measurement passes through, rank -> probe -> stored trial, and the parts they
# share (a record carries a part by deriving from it): each measurement declared once.
MEASUREMENT_RECORDS = [
    *(
        ("measurement.py", part)
        for part in (
            "StepTimes",
            "Throughput",
            "DevicePeaks",
            "HostPeakMeasure",
            "HostPeaks",
            "Versions",
            "LogTail",
            "LaunchTimes",
            "Fp16Skips",
        )
    ),
    ("protocol.py", "ScriptFacts"),
    ("protocol.py", "LossRecord"),
    ("protocol.py", "RankReport"),
    ("protocol.py", "ProbeResult"),
    ("study/records.py", "TrialRecord"),
]
# Each record's outcome is its own: a rank's statuses, a probe's and a trial's differ.
OWN_OUTCOME = ("status", "error")


def _fields(path: Path, record: str) -> dict[str, ast.AnnAssign]:
    """The fields class ``record`` declares in ``path`` (its bases' are theirs)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef) and node.name == record:
            return {
                item.target.id: item
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    raise AssertionError(f"{path}: no class {record}")


def _views(field: ast.AnnAssign) -> bool:
    """The field says which setting it holds (``SetBy(...)`` in its annotation)."""
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "SetBy"
        for node in ast.walk(field.annotation)
    )


def declared_twice(
    folder: Path, records: list[tuple[str, str]], own: tuple[str, ...] = ()
) -> list[str]:
    """Field names declared in two of ``records`` (file under ``folder``, class), where
    neither is a view of the other and the name is not one each record has of its own
    (``own``), as ``name: A, B``."""
    owners: dict[str, list[str]] = {}
    for relative, record in records:
        for name, field in _fields(folder / relative, record).items():
            if not _views(field) and name not in own:
                owners.setdefault(name, []).append(record)
    return [f"{name}: {', '.join(where)}" for name, where in owners.items() if len(where) > 1]


def test_each_setting_is_declared_once() -> None:
    twice = declared_twice(ROOT / "autotune", SETTINGS_RECORDS)
    assert twice == [], "settings declared in two records (declare once; a view says SetBy): " + (
        "; ".join(twice)
    )


def test_each_measurement_is_declared_once() -> None:
    twice = declared_twice(ROOT / "autotune", MEASUREMENT_RECORDS, OWN_OUTCOME)
    assert twice == [], "measurements declared in two records (share a part): " + "; ".join(twice)


def test_a_field_declared_twice_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "a.py": "class A:\n    budget_s: float = 1.0\n    seed: int = 0\n    status: str\n",
            "b.py": "class B:\n    budget_s: float = 2.0\n"
            "    seed: Annotated[int, SetBy('seed')] = 0\n    status: int\n",
        },
    )
    records = [("a.py", "A"), ("b.py", "B")]
    assert declared_twice(tmp_path, records) == ["budget_s: A, B", "status: A, B"]
    assert declared_twice(tmp_path, records, own=("status",)) == ["budget_s: A, B"]


# Where a backend's name may be written in a comparison outside backends/: a candidate's
# stored key (studies from before a second backend keep DeepSpeed's without its name) and
# the space file's per-backend sections and decisions.
NAMES_A_BACKEND_BY_DESIGN = ("candidate.py", "space/search_space.py")


def backend_name_comparisons(tree: Tree, names: set[str]) -> list[str]:
    """Comparisons with a backend's name (``candidate.backend == "fsdp2"``, ``"fsdp2" in
    backends``) outside ``backends/`` and the modules that name one by design: code
    elsewhere asks the backend (``get_backend(name).shards_by_block``, ...)."""
    found = []
    for path in modules(tree).values():
        relative = path.relative_to(tree.folder)
        if relative.parts[0] == "backends" or str(relative) in NAMES_A_BACKEND_BY_DESIGN:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Constant) and side.value in names
                for side in (node.left, *node.comparators)
            ):
                found.append(f"{path.relative_to(tree.folder.parent)}:{node.lineno}")
    return found


def test_only_backends_branch_on_a_backends_name() -> None:
    from autotune.backends import BACKENDS

    found = backend_name_comparisons(PACKAGE, set(BACKENDS))
    assert found == [], "ask the backend instead of comparing its name: " + ", ".join(found)


def test_a_comparison_with_a_backends_name_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path / "pkg",
        {
            "views/a.py": 'def f(c):\n    return c.backend == "fsdp2"\n',
            "views/b.py": 'def f(names):\n    return "fsdp2" in names\n',
            "backends/c.py": 'def f(c):\n    return c.backend == "fsdp2"\n',
            "candidate.py": 'def f(c):\n    return c.backend == "deepspeed"\n',
        },
    )
    tree = Tree(tmp_path / "pkg", import_root=tmp_path)
    assert sorted(backend_name_comparisons(tree, {"fsdp2", "deepspeed"})) == [
        str(Path("pkg/views/a.py")) + ":2",
        str(Path("pkg/views/b.py")) + ":2",
    ]
