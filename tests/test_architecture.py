"""The layout's rules, checked on the source: imports point down only and no two files import each other.

Every module of ``sciformer`` is parsed with ``ast`` (imports inside functions and under
``TYPE_CHECKING`` included). A module belongs to the layer of its longest matching prefix
in :data:`LAYERS`; an import from a lower layer to a higher one, or any cycle between
files, fails. The registry finds built-in models and datasets by module name
(``importlib.import_module`` on strings), which is not an import statement and is allowed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sciformer"

# Lower numbers sit lower. A module may import its own layer and the ones below.
LAYERS: dict[str, int] = {
    "sciformer": 0,  # the package root: __version__, and the API names it imports lazily by name (importlib)
    "sciformer.errors": 0,
    "sciformer.utils": 0,
    "sciformer.contracts": 1,
    "sciformer.registry": 1,
    "sciformer.geometry": 2,
    "sciformer.attention": 3,
    "sciformer.data": 4,
    "sciformer.pointcloud": 5,  # models
    "sciformer.spectral": 5,  # models
    "sciformer.config": 6,
    "sciformer.engine": 7,
    "sciformer.cli": 8,
    "sciformer.api": 8,  # the Python API: beside the command line, over the engine
    "sciformer.__main__": 9,
}
# Pairs (importer prefix, imported prefix) the issue names explicitly; implied by LAYERS, kept readable.
FORBIDDEN = [
    ("sciformer.data", "sciformer.pointcloud"), ("sciformer.data", "sciformer.spectral"), ("sciformer.data", "sciformer.engine"),
    ("sciformer.pointcloud", "sciformer.engine"), ("sciformer.pointcloud", "sciformer.cli"),
    ("sciformer.spectral", "sciformer.engine"), ("sciformer.spectral", "sciformer.cli"),
    ("sciformer.engine", "sciformer.cli"),
]


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = module_files()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def imported_modules(module: str, source: str | None = None) -> Iterator[tuple[str, int]]:
    """(sciformer module, line) of every import statement in ``module`` (or ``source``), anywhere in the file."""
    if source is None:
        source = MODULES[module].read_text(encoding="utf-8")
    tree = ast.parse(source)
    package = module if module in MODULES and _is_package(module) else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _resolve(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule's file
                if f"{name}.{alias.name}" in MODULES:
                    yield f"{name}.{alias.name}", node.lineno
                else:
                    yield from _resolve(name, node.lineno)


def _resolve(name: str, line: int) -> Iterator[tuple[str, int]]:
    while name and name not in MODULES:  # ``import sciformer.x.y`` of an attribute: its module
        name = name.rpartition(".")[0]
    if name.startswith("sciformer"):
        yield name, line


def layer(module: str) -> int:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    if prefix is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS in {Path(__file__).name}")
    return LAYERS[prefix]


GRAPH = {m: sorted({t for t, _ in imported_modules(m) if t != m}) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if layer(m) is None] == []
    assert len(MODULES) > 50  # the walk found the package


def test_no_upward_import() -> None:
    upward = [
        f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {t} (layer {layer(m)} -> {layer(t)})"
        for m in MODULES
        for t, line in imported_modules(m)
        if layer(t) > layer(m)
    ]
    assert upward == []


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN)
def test_named_arrows_are_absent(importer: str, imported: str) -> None:
    bad = [(m, t) for m in MODULES if m.startswith(importer) for t in GRAPH[m] if t.startswith(imported)]
    assert bad == []


def test_no_import_cycle_between_files() -> None:
    """Strongly connected components of the file import graph (Tarjan) must be single files."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
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
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_walker_sees_hidden_imports() -> None:
    """Imports inside functions, relative imports and ``from pkg import module`` are found (so the checks can fail)."""
    source = (
        "import numpy\n"
        "def f():\n"
        "    from ...engine import trainer\n"
        "    import sciformer.cli\n"
        "    from sciformer.geometry.knn import knn\n"
    )
    found = list(imported_modules("sciformer.data.pointcloud.fake", source))
    assert found == [("sciformer.engine.trainer", 3), ("sciformer.cli", 4), ("sciformer.geometry.knn", 5)]
    assert [layer(t) > layer("sciformer.data.pointcloud.fake") for t, _ in found] == [True, True, False]
    assert sum(len(targets) for targets in GRAPH.values()) > 200  # the real graph is not empty


def test_no_file_over_400_lines() -> None:
    long = {str(path.relative_to(PACKAGE.parent)): n for path in MODULES.values() if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}
