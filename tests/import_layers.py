#!/usr/bin/env python3
"""The package's import layers, checked (``make lint``): a module may import its own package and the layers below
its own, never a layer above nor a sibling in its own layer. Every import counts, a lazy one inside a function too.

Run: ``tests/import_layers.py [PACKAGE_DIR]`` (default ``controller/cachepilot``); prints each upward import as
``file:line: a imports b (layer i above j)`` and exits 1, or exits 0. A package or module the table does not list is
an error too: a new one gets its place here when it is added.

It also checks that the module import graph has no cycle (issue 35): within a unit too, every import counted, one under
``TYPE_CHECKING`` as well -- a type-level circle is a circle of concepts (status read the daemon it is built by; a
backend looked itself up in the table that names it). Each cycle is printed as its modules.

And that no class is longer than ``MAX_CLASS_LINES`` (``end_lineno - lineno`` of its definition): a class
past that holds more than one concept, and its parts become collaborators in modules of their own (issue 22).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "cachepilot"

# Top first. Units on one line are siblings: independent of each other. Both the engine and the backends sit on
# actions and capabilities, and neither imports the other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("commands",),
    ("daemon", "display", "sim"),
    ("trace", "hotlist"),
    ("engine", "backends", "actuators", "probe", "exporter", "workloads", "fsfiles"),
    ("policy", "records"),
    ("models", "mountinfo"),
    ("events", "actions", "capabilities", "safeio"),
    ("errors", "units", "bpf_layout", "boundedserver", "handles", "__init__"),
)
LAYER = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}
MAX_CLASS_LINES = 400


def unit_of(module: str, root_names: frozenset[str]) -> str:
    """``cachepilot.engine.engine`` -> ``engine``; ``cachepilot`` itself (or a name defined in its __init__) ->
    ``__init__``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1] if parts[1] in root_names else "__init__"


def imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import of the package, ``from cachepilot import x`` as ``cachepilot.x``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PACKAGE:
                for alias in node.names:
                    yield node.lineno, f"{PACKAGE}.{alias.name}"
            elif node.module.split(".")[0] == PACKAGE:
                yield node.lineno, node.module


def check(package_dir: Path) -> list[str]:
    """Every upward or sideways import under ``package_dir`` (the directory of the package), as one line each."""
    root_names = frozenset(p.stem for p in package_dir.iterdir()
                           if p.suffix == ".py" or (p.is_dir() and any(p.rglob("*.py"))))
    problems = [f"{package_dir / name}: not in the import layers (tests/import_layers.py)"
                for name in sorted(root_names - LAYER.keys()) if name != "__init__"]
    for path in sorted(package_dir.rglob("*.py")):
        me = path.relative_to(package_dir).with_suffix("").parts[0]
        if me not in LAYER:
            continue
        for line, module in imports(ast.parse(path.read_text(), str(path))):
            other = unit_of(module, root_names)
            if other == me or other not in LAYER:
                continue
            if LAYER[other] <= LAYER[me]:
                where = "a sibling in its layer" if LAYER[other] == LAYER[me] else "a layer above"
                problems.append(f"{path}:{line}: {me} imports {other} ({where})")
    return problems


def _module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file (a package by its ``__init__``)."""
    out = {}
    for path in package_dir.rglob("*.py"):
        parts = [PACKAGE, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _module_of(name: str, modules: dict[str, Path]) -> str | None:
    """The module an import names: itself, or the nearest enclosing module (``from a.b import C`` -> ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def module_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import mod`` as ``pkg.mod``)."""
    modules = _module_names(package_dir)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` the module mod
                named = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names]
            else:
                continue
            deps |= {d for d in (_module_of(n, modules) for n in named) if d is not None and d != name}
        graph[name] = deps
    return graph


def cycles(package_dir: Path) -> list[str]:
    """Every set of modules that import each other round a circle (a strongly connected component of more than one
    module), as one line each."""
    graph = module_graph(package_dir)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [f"import cycle: {' -> '.join(c)} (each imports another of them)" for c in sorted(found)]


def oversized_classes(package_dir: Path) -> list[str]:
    """Every class under ``package_dir`` longer than MAX_CLASS_LINES, as one line each."""
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno
                if size > MAX_CLASS_LINES:
                    problems.append(f"{path}:{node.lineno}: class {node.name} is {size} lines"
                                    f" (at most {MAX_CLASS_LINES}: split it by concept)")
    return problems


def main(argv: list[str]) -> int:
    package_dir = Path(argv[1] if len(argv) > 1 else "controller/cachepilot")
    problems = check(package_dir) + cycles(package_dir) + oversized_classes(package_dir)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
