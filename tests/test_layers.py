"""The layers of bench/ and analysis/, read from the code's imports (ast): no import circles, and
every import between layers points down to a layer it may use. The layer table lives here.

Every import counts, at module level or inside a function (a lazy import still ties the two
modules together). `from P import N` is an import of module P.N where that is a module, else of
P. A layer is a package (or `analysis`); a module belongs to the layer whose name is the longest
prefix of its own.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Layer -> the layers it may import. The order is the order of the floors, the ground first:
# a layer may import only layers above it in this table (test_the_table_runs_downward).
LAYERS: dict[str, tuple[str, ...]] = {
    "bench.common": (),
    "bench.storage": ("bench.common",),
    "bench.measure": ("bench.common", "bench.storage"),
    "bench.workloads": ("bench.common", "bench.storage"),
    "bench.engines": ("bench.common", "bench.storage", "bench.measure"),
    "bench.config": ("bench.common", "bench.engines", "bench.workloads"),
    "analysis": ("bench.common", "bench.measure"),
}
LAYERS["bench.run"] = tuple(LAYERS)  # everything below it
LAYERS["bench.cli"] = tuple(LAYERS)  # the top floor: everything
# Modules outside the table: the root package (its version; it imports nothing) is free to
# everyone, and `python -m bench` is the command line's.
ROOT = "bench"
ALIASES = {"bench.__main__": "bench.cli"}


def modules(root: Path) -> dict[str, Path]:
    """Every module of bench/ and analysis/ under `root`, by dotted name."""
    out = {}
    for top in ("bench", "analysis"):
        for p in sorted((root / top).rglob("*.py")):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import of bench or analysis in module `name`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield from _ours(a.name, node.lineno, known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                yield from _ours(sub if sub in known else base, node.lineno, known)


def _ours(module: str, line: int, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    if module.split(".")[0] not in ("bench", "analysis"):
        return
    while module not in known and "." in module:  # `import bench.x.y` of a name inside x
        module = module.rpartition(".")[0]
    yield module, line


def layer_of(module: str) -> str | None:
    module = ALIASES.get(module, module)
    best = None
    for layer in LAYERS:
        if (module == layer or module.startswith(layer + ".")) and (
            best is None or len(layer) > len(best)
        ):
            best = layer
    return best


def problems(root: Path) -> list[str]:
    """What breaks the layering of the code under `root`: modules of no layer, imports between
    layers that the table does not allow, and import circles. Empty when all holds."""
    known = modules(root)
    out: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        mine = layer_of(name)
        if mine is None and name != ROOT:
            out.append(f"{name} ({path.relative_to(root)}) belongs to no layer")
            continue
        for dep, line in imports(name, path, known):
            if dep == name:
                continue
            graph[name].add(dep)
            theirs = layer_of(dep)
            if name == ROOT:
                out.append(f"{name} imports {dep}: the root package imports nothing")
            elif theirs is None or theirs == mine:
                continue
            elif theirs not in LAYERS[mine]:
                up = list(LAYERS).index(theirs) > list(LAYERS).index(mine)
                out.append(
                    f"{path.relative_to(root)}:{line}: {name} imports {dep} "
                    f"({'an upward import: ' if up else ''}{mine} may import only "
                    f"{', '.join(LAYERS[mine]) or 'nothing of bench'})"
                )
    out.extend(f"import circle: {' -> '.join(c)}" for c in circles(graph))
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a -> ... -> a) through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_through(g, graph) for g in groups]


def _path_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A circle within `group` starting at its first module (breadth first, so the shortest)."""
    start, members = group[0], set(group)
    prev: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start, *reversed(path[:-1]), start] if v != start else [start, start]
            if w not in prev:
                prev[w] = v
                todo.append(w)
    return group


def test_the_layers_hold():
    assert problems(REPO) == []


def test_the_table_runs_downward():
    order = list(LAYERS)
    for layer, allowed in LAYERS.items():
        for a in allowed:
            assert order.index(a) < order.index(layer), f"{layer} may import {a}, above it"


def test_every_layer_says_what_it_may_import():
    """Each layer package's docstring names the layers it may import, as the table does."""
    for layer, allowed in LAYERS.items():
        init = REPO.joinpath(*layer.split(".")) / "__init__.py"
        if not init.exists():  # bench.cli is a module, on the top floor
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        said = [ln for ln in doc.splitlines() if ln.startswith("Imports:")]
        assert said, f"{init.relative_to(REPO)}: no 'Imports:' line in the docstring"
        named = [n for n in re.findall(r"\b(?:bench\.\w+|analysis)\b", said[0]) if n in LAYERS]
        if not allowed:
            assert "nothing of bench" in said[0], said[0]
        elif layer == "bench.run":
            assert "every layer below" in said[0], said[0]
        else:
            assert sorted(named) == sorted(allowed), (layer, said[0])


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    for top in ("bench", "analysis"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _plant(root: Path, rel: str, line: str) -> None:
    p = root / rel
    p.write_text(p.read_text() + f"\n\ndef _planted():\n    {line}\n")


def test_a_planted_circle_fails(copy: Path):
    """storage.layout imports checksums; checksums importing layout back (in a function, as a
    lazy import would) closes a circle inside one layer."""
    assert problems(copy) == []
    _plant(copy, "bench/storage/checksums.py", "from bench.storage import layout")
    assert problems(copy) == [
        "import circle: bench.storage.checksums -> bench.storage.layout -> bench.storage.checksums"
    ]


def test_a_planted_upward_import_fails(copy: Path):
    """The environment block importing an engine again (as it did for kvikio) is an import from
    measure up to engines; an engine importing the sweep, one up to run."""
    _plant(copy, "bench/measure/env.py", "from bench.engines.gds import kvikio_info")
    _plant(copy, "bench/engines/striped.py", "import bench.run.sweep")
    got = problems(copy)
    assert len(got) == 3, got  # two upward imports, and the circle the first one closes
    assert got[0].startswith("bench/engines/striped.py:") and got[0].endswith(
        "bench.engines.striped imports bench.run.sweep (an upward import: bench.engines may"
        " import only bench.common, bench.storage, bench.measure)"
    )
    assert got[1].startswith("bench/measure/env.py:") and "imports bench.engines.gds" in got[1]
    assert got[2].startswith("import circle: ") and "bench.measure.env" in got[2]


def test_analysis_never_runs_an_engine(copy: Path):
    _plant(copy, "analysis/runs.py", "from bench.engines import create")
    (got,) = problems(copy)
    assert got.endswith(
        "analysis.runs imports bench.engines (analysis may import only bench.common, bench.measure)"
    )


def test_a_module_outside_the_layers_fails(copy: Path):
    (copy / "bench" / "helpers.py").write_text('"""Loose."""\n')
    assert problems(copy) == ["bench.helpers (bench/helpers.py) belongs to no layer"]
