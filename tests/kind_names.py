#!/usr/bin/env python3
"""No cache-kind name outside the table of kinds (``make lint``): ``backends/`` (each kind's module and the table)
and ``capabilities.py`` (each kind's declared traits) name the kinds; every other module asks a kind for a declared
trait (``Capabilities.hold``, ``.ready_reserve``, ``.shared_cache_set`` ...), so that a new kind is one module and
one declaration, never a hunt for ``if kind == "bcache"``.

Reported: a string literal that *is* a kind name (``"bcache"``; prose that mentions one -- a docstring, a log
message -- is not a test of it) and an import of a ``KIND_*`` name, except in the modules that must pick a kind
(:data:`MAY_NAME`: the volume record's default kind, the simulator's choice of the kind it models).

Run: ``tests/kind_names.py [PACKAGE_DIR]`` (default ``controller/cachepilot``); prints ``file:line: ...`` for each
and exits 1, or exits 0.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

OWNERS = ("backends/", "capabilities.py")  # where kinds are declared (relative to the package)
MAY_NAME = ("models/volume.py", "sim/")  # may import a KIND_* constant (never write the name itself)


def kind_names(package_dir: Path) -> dict[str, str]:
    """The declared kinds, read from capabilities.py without importing it: ``KIND_X = "name"`` (several on a line
    too) -> {name: constant}."""
    tree = ast.parse((package_dir / "capabilities.py").read_text())
    out: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for n, v in zip(names, values, strict=False):
                if isinstance(n, ast.Name) and n.id.startswith("KIND_") and isinstance(v, ast.Constant):
                    out[str(v.value)] = n.id
    return out


def check(package_dir: Path) -> list[str]:
    kinds = kind_names(package_dir)
    constants = set(kinds.values())
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if rel.startswith(OWNERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in kinds:
                problems.append(f"{path}:{node.lineno}: the kind name {node.value!r}: ask the kind for a declared "
                                "trait (capabilities.Capabilities) instead")
            elif isinstance(node, ast.ImportFrom) and not rel.startswith(MAY_NAME):
                named = sorted(a.name for a in node.names if a.name in constants)
                if named:
                    problems.append(f"{path}:{node.lineno}: imports {', '.join(named)}: ask the kind for a declared "
                                    "trait (capabilities.Capabilities) instead")
    return problems


def main(argv: list[str]) -> int:
    problems = check(Path(argv[1] if len(argv) > 1 else "controller/cachepilot"))
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
