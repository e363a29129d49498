"""The import-layer check that make lint runs (tests/import_layers.py): the package passes, an upward import fails;
so does a class over 400 lines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_layers", ROOT / "tests" / "import_layers.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    pkg = tmp / "cachepilot"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_the_package_keeps_its_layers() -> None:
    assert _checker().check(ROOT / "controller" / "cachepilot") == []


def test_an_upward_import_fails_even_a_lazy_one(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "engine/__init__.py": "from cachepilot.actions import Action\n",
        "actions.py": "from cachepilot.errors import UserError\n",
        "errors.py": "",
        "backends/base.py": "def f():\n    from cachepilot.engine import Engine\n",  # the old cycle, lazily
        "models/hot.py": "from cachepilot import engine\n",
    })
    assert sorted(_checker().check(pkg)) == [
        f"{pkg / 'backends/base.py'}:2: backends imports engine (a sibling in its layer)",
        f"{pkg / 'models/hot.py'}:1: models imports engine (a layer above)",
    ]


def test_a_module_without_a_layer_is_reported(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {"plugins.py": "from cachepilot.errors import UserError\n", "errors.py": ""})
    assert _checker().check(pkg) == [f"{pkg / 'plugins'}: not in the import layers (tests/import_layers.py)"]


def test_no_class_in_the_package_is_over_400_lines() -> None:
    assert _checker().oversized_classes(ROOT / "controller" / "cachepilot") == []


def test_a_class_over_400_lines_is_reported_and_fails_main(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(400))
    pkg = _tree(tmp_path, {"errors.py": f"class AtTheLimit:\n{body}", "units.py": f"class Big:\n{body}    y = 0\n"})
    checker = _checker()
    assert checker.oversized_classes(pkg) == [
        f"{pkg / 'units.py'}:1: class Big is 401 lines (at most 400: split it by concept)"]
    assert checker.main(["import_layers.py", str(pkg)]) == 1


def test_the_package_has_no_import_cycle() -> None:
    assert _checker().cycles(ROOT / "controller" / "cachepilot") == []


def test_an_import_cycle_is_reported_even_through_type_checking(tmp_path: Path) -> None:
    # issue 35: status read the daemon that builds it (a TYPE_CHECKING import back), a backend looked itself up
    # in the table of kinds that names it (a lazy import back)
    pkg = _tree(tmp_path, {
        "daemon/__init__.py": "",
        "daemon/daemon.py": "from cachepilot.daemon import status\n",
        "daemon/status.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from cachepilot.daemon.daemon import Daemon\n",
        "backends/__init__.py": "",
        "backends/kinds.py": "from cachepilot.backends.operation import Setting\n",
        "backends/operation.py": "def f():\n    from cachepilot.backends import kinds\n",
        "engine/__init__.py": "from cachepilot.engine.engine import Engine\n",
        "engine/engine.py": "from cachepilot.engine.handoff import queue\n",
        "engine/handoff.py": "import numpy\n",
    })
    assert _checker().cycles(pkg) == [
        "import cycle: cachepilot.backends.kinds -> cachepilot.backends.operation (each imports another of them)",
        "import cycle: cachepilot.daemon.daemon -> cachepilot.daemon.status (each imports another of them)",
    ]
