"""The package's layering, read from the modules' own imports.

Layers, lowest first; a module may import its own layer and the layers below
it, never one above:

    base      errors, kineto, resources (facts and failures every layer shares)
    algo      pure algorithms over typed arrays and small records, no I/O
    io        bytes in and out
    engine    the two passes
    commands  one module per command
    face      cli/*, __init__, __main__ (the only importers of commands;
              the library's face, __init__, does not import the command line)

``synth`` (the trace generator) stands apart and imports no other module of
the package, so the tests can use it alone; the ``synth`` command
(``commands.synth``) and the face use it.

Two more rules: no import cycle between modules (a function-level or
type-checking import counts: it is the same dependency, only later), and
``io`` does no process management (child processes, signals and pipes
between processes are execution strategies: they live in ``engine``).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from conftest import all_but_first_slow

PACKAGE = Path(__file__).resolve().parent.parent / "streamtrace"
ORDER = ["base", "algo", "io", "engine", "commands", "face"]
BASE = {"errors", "kineto", "resources"}
FACE = {"cli", "__init__", "__main__"}
PROCESS_MANAGEMENT = {"multiprocessing", "subprocess", "signal", "fcntl", "concurrent"}


def layer_of(module: str) -> str:
    """The layer of a module named relative to the package (``io.reader``)."""
    head = module.split(".")[0]
    if head in BASE:
        return "base"
    if head in FACE or module == "":
        return "face"
    if head == "synth":
        return "synth"
    if head in ORDER:
        return head
    raise AssertionError(f"module {module!r} belongs to no layer: add it to a package or to BASE in {__file__}")


ImportStatement = tuple[int, int, "str | None", tuple[str, ...]]
"""(line, level, module, names) of an ``import`` (level -1) or ``from ... import`` statement."""


@functools.lru_cache(maxsize=None)
def import_statements(text: str) -> tuple[ImportStatement, ...]:
    """Every import statement of a module's text, deferred ones included (parsed once per text: the
    planted-violation tests read copies of the package that differ in one module)."""
    found: list[ImportStatement] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.level, node.module, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Import):
            found.append((node.lineno, -1, None, tuple(alias.name for alias in node.names)))
    return tuple(found)


def imported_modules(path: Path, package_root: Path) -> list[tuple[int, str]]:
    """(line, module relative to the package) for every package import in ``path``."""
    own = path.relative_to(package_root).with_suffix("").parts
    package = own[:-1]  # what ``from . import`` names, for a module and a package's __init__ alike
    found = []
    for line, level, module, names in import_statements(path.read_text(encoding="utf-8")):
        if level < 0:
            found.extend((line, ".".join(name.split(".")[1:])) for name in names
                         if name.split(".")[0] == package_root.name)
            continue
        if level:
            base = list(package[: len(package) - (level - 1)] if level > 1 else package)
            target = base + (module.split(".") if module else [])
        elif module and module.split(".")[0] == package_root.name:
            target = module.split(".")[1:]
        else:
            continue
        for name in names:  # ``from .io import sink`` imports a module, ``from .io.sink import X`` a name
            as_module = package_root.joinpath(*target, name)
            if as_module.with_suffix(".py").exists() or as_module.is_dir():
                found.append((line, ".".join(target + [name])))
            else:
                found.append((line, ".".join(target)))
    return found


def violations(package_root: Path) -> list[str]:
    """Every import that goes up a layer (or out of ``synth``), as ``file:line: a -> b``."""
    problems = []
    for path in sorted(package_root.rglob("*.py")):
        module = ".".join(path.relative_to(package_root).with_suffix("").parts)
        source = layer_of(module)
        for line, target in imported_modules(path, package_root):
            if target in ("", "__version__"):
                continue  # the package's own face (``from . import __version__``)
            target_layer = layer_of(target)
            if module == "__init__" and target.split(".")[0] == "cli":
                ok = False  # the library API does not depend on the command line
            elif source == "synth":
                ok = target_layer == "synth"
            elif target_layer == "synth":
                ok = source in ("commands", "face")  # the synth command, and the demo
            else:
                ok = ORDER.index(target_layer) <= ORDER.index(source)
            if not ok:
                problems.append(f"{path.relative_to(package_root.parent)}:{line}: {source} {module} -> {target_layer} {target}")
    return problems


def module_name(path: Path, package_root: Path) -> str:
    """``io.reader`` for io/reader.py, ``cli`` for cli/__init__.py."""
    parts = path.relative_to(package_root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def import_graph(package_root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``__version__`` from the package's face left out)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package_root.rglob("*.py")):
        targets = {target for _, target in imported_modules(path, package_root) if target not in ("", "__version__")}
        graph[module_name(path, package_root)] = targets
    return graph


def cycles(package_root: Path) -> list[list[str]]:
    """Each import cycle between modules, as the modules around it (Tarjan's strongly connected components)."""
    graph = import_graph(package_root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph.get(module, ()):
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def process_management_in_io(package_root: Path) -> list[str]:
    """``io`` modules that import a process-management module of the standard library."""
    problems = []
    for path in sorted((package_root / "io").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            problems += [f"{path.relative_to(package_root.parent)}:{node.lineno}: {name}"
                         for name in names if name.split(".")[0] in PROCESS_MANAGEMENT]
    return problems


def test_package_keeps_its_layers() -> None:
    assert violations(PACKAGE) == []


def test_no_import_cycle() -> None:
    assert cycles(PACKAGE) == []


def test_io_manages_no_processes() -> None:
    assert process_management_in_io(PACKAGE) == []


def test_the_command_line_is_on_the_top_layer_only() -> None:
    """Every module of cli/ is face, and only ``__main__`` and cli itself import it (the library's face does not)."""
    graph = import_graph(PACKAGE)
    command_line = {module for module in graph if module.split(".")[0] == "cli"}
    assert len(command_line) > 10 and {layer_of(module) for module in command_line} == {"face"}
    importers = {module for module, targets in graph.items() if any(target.split(".")[0] == "cli" for target in targets)}
    assert importers - command_line == {"__main__"}


def test_every_module_sits_in_a_layer() -> None:
    modules = [".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")]
    layers = {layer_of(m) for m in modules}
    assert layers == set(ORDER) | {"synth"}


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("module, line, broken", all_but_first_slow([
    ("algo/lanes.py", "from ..io.reader import TraceReader\n", "algo algo.lanes -> io io.reader"),
    ("algo/lanes.py", "from streamtrace.engine import passes\n", "algo algo.lanes -> engine engine.passes"),
    ("io/reader.py", "from ..commands.compact import compact\n", "io io.reader -> commands commands.compact"),
    ("engine/passes.py", "from ..commands import compact\n", "engine engine.passes -> commands commands.compact"),
    ("errors.py", "import streamtrace.algo.lanes\n", "base errors -> algo algo.lanes"),
    ("synth/__init__.py", "from ..io import sink\n", "synth synth.__init__ -> io io.sink"),
    ("commands/inspect.py", "from ..cli.report import human_report\n", "commands commands.inspect -> face cli.report"),
    ("__init__.py", "from .cli import main\n", "face __init__ -> face cli"),
]))
def test_a_deliberate_violation_is_caught(tmp_path: Path, module: str, line: str, broken: str) -> None:
    """A copy of the package with one import that goes up a layer fails the rule."""
    root = tmp_path / "streamtrace"
    copy_of_package(root)
    assert violations(root) == []
    _write(root, module, (root / module).read_text(encoding="utf-8") + line)
    found = violations(root)
    assert len(found) == 1 and found[0].endswith(broken), found


def copy_of_package(root: Path) -> None:
    for path in PACKAGE.rglob("*.py"):
        _write(root, str(path.relative_to(PACKAGE)), path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("module, line, cycle", [
    ("io/source.py", "from .reader import TraceReader\n", ["io.reader", "io.source"]),  # two modules
    ("algo/ids.py", "from .lanes import pack_lanes\n", None),  # lanes does not import ids: no cycle
    ("engine/plan.py", "if False:\n    from .passes import index_pass\n", ["engine.passes", "engine.plan"]),
    ("engine/parseproc.py", "def later():\n    from .passes import index_pass\n", ["engine.parseproc", "engine.passes"]),
])
def test_a_planted_cycle_is_caught(tmp_path: Path, module: str, line: str, cycle: list[str] | None) -> None:
    """A copy of the package with one import that closes a loop (even one
    deferred into a function or a type-checking block) fails the rule."""
    root = tmp_path / "streamtrace"
    copy_of_package(root)
    assert cycles(root) == []
    _write(root, module, (root / module).read_text(encoding="utf-8") + line)
    found = cycles(root)
    if cycle is None:
        assert found == []
    else:
        assert len(found) == 1 and set(cycle) <= set(found[0]), found


def test_a_parse_child_in_io_is_caught(tmp_path: Path) -> None:
    root = tmp_path / "streamtrace"
    copy_of_package(root)
    _write(root, "io/reader.py", (root / "io/reader.py").read_text(encoding="utf-8") + "import multiprocessing\n")
    assert [problem.split(": ")[-1] for problem in process_management_in_io(root)] == ["multiprocessing"]
