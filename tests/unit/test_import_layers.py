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
