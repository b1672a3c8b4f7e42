"""The package's one rule: layers import only downward, and no modules import each other in a
circle. Every import is counted, function-level ones included (a lazy import is still a
dependency). The layers, from the top:

    app          typer, the command line, the views (terminal output)
    experiments  one package per experiment: its options, its rows, its run(); never prints
    output       run folder, recorder, CSV/JSON, plots, report, compare, render
    net          HTTP (aiohttp): the OpenAI-compatible client, and the server around the engine
    runtime      torch: device, backends, timing, model, caches, engine, distributed, session
    core         no torch: options as data, config, accounting, scheduler, simulator, ...
    base         benchbatch.errors and benchbatch.signals (the standard library only)
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "benchbatch"
LAYERS = ("base", "core", "runtime", "net", "output", "experiments", "app")
BASE = ("benchbatch", "benchbatch.errors", "benchbatch.signals")


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def layer(module: str) -> int:
    if module == "benchbatch.__main__":
        return LAYERS.index("app")
    if module in BASE:
        return 0
    top = module.split(".")[1]
    assert top in LAYERS, f"{module} sits in no layer (benchbatch/{top}/ is not one of {LAYERS})"
    return LAYERS.index(top)


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `module` imports anywhere in its file."""
    found = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            # a submodule named in the list is the import; anything else is the module's
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]  # fmt: skip
        for name in names:
            while name and name not in known:  # benchbatch.core.config.ModelConfig -> module
                name = name.rpartition(".")[0]
            if name and name != module and name != "benchbatch":
                found.add(name)
    return found


def graph(known: dict[str, Path]) -> dict[str, set[str]]:
    return {m: imports(m, p, known) for m, p in known.items()}


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} ({LAYERS[layer(a)]}) imports {b} ({LAYERS[layer(b)]})"
        for a, targets in edges.items()
        for b in targets
        if layer(b) > layer(a)
    )


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm); a parent
    package's __init__ importing its own children does not count."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_every_module_sits_in_a_layer():
    for module in modules():
        layer(module)


def test_layers_import_only_downward():
    assert upward(graph(modules())) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circles(graph(modules())) == []


def test_only_the_app_imports_typer():
    known = modules()
    for module, path in known.items():
        if layer(module) == LAYERS.index("app"):
            continue
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("typer", "click")], module


def test_the_rule_catches_an_upward_import_and_a_circle(tmp_path):
    """The checks above can fail: a core module importing the app, and two core modules
    importing each other, are both found."""
    pkg = tmp_path / "benchbatch"
    for sub in ("core", "app"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "app" / "cli.py").write_text("import typer\n")
    (pkg / "core" / "a.py").write_text("def f():\n    from benchbatch.app import cli\n")
    (pkg / "core" / "b.py").write_text("from benchbatch.core import c\n")
    (pkg / "core" / "c.py").write_text("def g():\n    from . import b\n")
    edges = graph(modules(pkg))
    assert upward(edges) == ["benchbatch.core.a (core) imports benchbatch.app.cli (app)"]
    assert circles(edges) == [["benchbatch.core.b", "benchbatch.core.c"]]


def _experiment_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "experiments" else None


def private_reaches(known: dict[str, Path]) -> list[str]:
    """Names starting with an underscore that one experiment takes from another's modules:
    imported by name, or read as an attribute of the other's module."""
    found = []
    for module, path in known.items():
        mine = _experiment_of(module)
        if mine is None:
            continue
        tree = ast.parse(path.read_text())
        aliases = {}  # local name -> another experiment's module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    other = _experiment_of(full if full in known else node.module)
                    if other is None or other == mine:
                        continue
                    if full in known:
                        aliases[a.asname or a.name] = full
                    elif a.name.startswith("_"):
                        found.append(f"{module} imports {node.module}.{a.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")):  # fmt: skip
                found.append(f"{module} reads {aliases[node.value.id]}.{node.attr}")
    return sorted(set(found))


def test_no_experiment_reaches_into_another_experiments_private_names():
    assert private_reaches(modules()) == []


def test_the_private_check_can_fail(tmp_path):
    pkg = tmp_path / "benchbatch"
    for sub in ("experiments", "experiments/a", "experiments/b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "experiments" / "a" / "run.py").write_text("def _hidden():\n    pass\n")
    (pkg / "experiments" / "b" / "run.py").write_text(
        "from benchbatch.experiments.a import run as a\n"
        "from benchbatch.experiments.a.run import _hidden\n"
        "a._hidden()\n"
    )
    assert private_reaches(modules(pkg)) == [
        "benchbatch.experiments.b.run imports benchbatch.experiments.a.run._hidden",
        "benchbatch.experiments.b.run reads benchbatch.experiments.a.run._hidden",
    ]
