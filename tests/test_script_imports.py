"""The benchmark scripts (scripts/*.py) use benchbatch's modules, most of them in functions
that run only in a long bench: every name they import from benchbatch, at the top or
inside a function, must still be there after the package's files move (newcomer_check.py
imported ranges_overlap from output/compare.py for a day after it moved to
compare_serve.py, and --compare failed only at its end)."""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parent.parent / "scripts").glob("*.py"))


def benchbatch_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) for every import of benchbatch in the file, wherever it stands;
    name None for a plain `import benchbatch.x`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchbatch"):
            found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names
                      if a.name.startswith("benchbatch")]  # fmt: skip
    return found


def missing(module: str, name: str | None) -> bool:
    mod = importlib.import_module(module)
    if name is None or hasattr(mod, name):
        return False
    try:  # a submodule: `from benchbatch.core import units`
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return True
    return False


def module_attributes(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, attribute) for every `alias.name` the file reads where alias is a
    benchbatch module it imported (`from benchbatch.runtime import steps`: steps.time_step)."""
    tree = ast.parse(path.read_text())
    modules = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchbatch"):
            for a in node.names:
                if missing(node.module, a.name):
                    continue
                obj = getattr(importlib.import_module(node.module), a.name, None)
                if obj is None or isinstance(obj, types.ModuleType):
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            modules |= {a.asname: a.name for a in node.names
                        if a.asname and a.name.startswith("benchbatch")}  # fmt: skip
    return [(n.lineno, modules[n.value.id], n.attr) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in modules and isinstance(n.ctx, ast.Load)]  # fmt: skip


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_attribute_a_script_reads_off_a_benchbatch_module_exists(script):
    gone = [f"{script.name}:{line} {module}.{attr}"
            for line, module, attr in module_attributes(script)
            if not hasattr(importlib.import_module(module), attr)]  # fmt: skip
    assert not gone, gone


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchbatch_name_a_script_imports_exists(script):
    gone = [f"{script.name}:{line} {module}.{name}"
            for line, module, name in benchbatch_imports(script)
            if missing(module, name)]  # fmt: skip
    assert not gone, gone


def test_the_check_finds_a_name_that_is_not_there(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text("def f():\n    from benchbatch.output.compare import ranges_overlap\n")
    (line, module, name), = benchbatch_imports(script)
    assert (line, module, name) == (2, "benchbatch.output.compare", "ranges_overlap")
    assert missing(module, name)
    assert not missing("benchbatch.output.compare_serve", "ranges_overlap")
    assert not missing("benchbatch.core", "units")
    script.write_text("from benchbatch.core import units\nunits.figure(1)\nunits.gone(2)\n")
    assert module_attributes(script) == [(2, "benchbatch.core.units", "figure"),
                                         (3, "benchbatch.core.units", "gone")]  # fmt: skip
