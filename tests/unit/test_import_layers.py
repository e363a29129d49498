"""The import-layer check that make lint runs (tests/import_layers.py): the package passes, an upward import fails."""

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
