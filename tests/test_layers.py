"""The package's layering, read from the modules' own imports.

Layers, lowest first; a module may import its own layer and the layers below
it, never one above:

    base      errors, kineto, resources (facts and failures every layer shares)
    algo      pure algorithms over typed arrays and small records, no I/O
    io        bytes in and out
    engine    the two passes
    commands  one module per command
    face      cli, __init__, __main__ (the only importers of commands)

``synth`` (the trace generator) stands apart and imports no other module of
the package, so the demo and the tests can use it alone.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "streamtrace"
ORDER = ["base", "algo", "io", "engine", "commands", "face"]
BASE = {"errors", "kineto", "resources"}
FACE = {"cli", "__init__", "__main__"}


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


def imported_modules(path: Path, package_root: Path) -> list[tuple[int, str]]:
    """(line, module relative to the package) for every package import in ``path``."""
    own = path.relative_to(package_root).with_suffix("").parts
    package = own[:-1]  # what ``from . import`` names, for a module and a package's __init__ alike
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - (node.level - 1)] if node.level > 1 else package)
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == package_root.name:
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:  # ``from .io import sink`` imports a module, ``from .io.sink import X`` a name
                as_module = package_root.joinpath(*target, alias.name)
                if as_module.with_suffix(".py").exists() or as_module.is_dir():
                    found.append((node.lineno, ".".join(target + [alias.name])))
                else:
                    found.append((node.lineno, ".".join(target)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package_root.name:
                    found.append((node.lineno, ".".join(parts[1:])))
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
            if "synth" in (source, target_layer):
                ok = source == target_layer or source == "face"
            else:
                ok = ORDER.index(target_layer) <= ORDER.index(source)
            if not ok:
                problems.append(f"{path.relative_to(package_root.parent)}:{line}: {source} {module} -> {target_layer} {target}")
    return problems


def test_package_keeps_its_layers() -> None:
    assert violations(PACKAGE) == []


def test_every_module_sits_in_a_layer() -> None:
    modules = [".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")]
    layers = {layer_of(m) for m in modules}
    assert layers == set(ORDER) | {"synth"}


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("module, line, broken", [
    ("algo/lanes.py", "from ..io.reader import TraceReader\n", "algo algo.lanes -> io io.reader"),
    ("algo/lanes.py", "from streamtrace.engine import passes\n", "algo algo.lanes -> engine engine.passes"),
    ("io/reader.py", "from ..commands.compact import compact\n", "io io.reader -> commands commands.compact"),
    ("engine/passes.py", "from ..commands import compact\n", "engine engine.passes -> commands commands.compact"),
    ("errors.py", "import streamtrace.algo.lanes\n", "base errors -> algo algo.lanes"),
    ("synth.py", "from .io import sink\n", "synth synth -> io io.sink"),
])
def test_a_deliberate_violation_is_caught(tmp_path: Path, module: str, line: str, broken: str) -> None:
    """A copy of the package with one import that goes up a layer fails the rule."""
    root = tmp_path / "streamtrace"
    for path in PACKAGE.rglob("*.py"):
        _write(root, str(path.relative_to(PACKAGE)), path.read_text(encoding="utf-8"))
    assert violations(root) == []
    _write(root, module, (root / module).read_text(encoding="utf-8") + line)
    found = violations(root)
    assert len(found) == 1 and found[0].endswith(broken), found
