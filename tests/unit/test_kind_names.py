"""Issue 35 item 2: no cache-kind name outside the table of kinds (tests/kind_names.py, run by make lint): the
package passes; a kind name as a literal, or a KIND_* import, anywhere else fails; prose that mentions a kind does
not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kind_names", ROOT / "tests" / "kind_names.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_package_names_kinds_only_in_the_table() -> None:
    assert _checker().check(ROOT / "controller" / "cachepilot") == []


def test_a_kind_name_outside_the_table_fails(tmp_path: Path) -> None:
    pkg = tmp_path / "cachepilot"
    files = {
        "capabilities.py": 'KIND_BCACHE, KIND_DMCACHE = "bcache", "dm-cache"\nKIND_LVMCACHE = "lvmcache"\n',
        "backends/bcache.py": 'NAME = "bcache"\n',  # the table's own
        "engine/lifetime.py": '"""bcache holds data dirty below its target."""\nSTOCK = {"bcache": 10}\n',
        "actuators/promote.py": "from cachepilot.capabilities import KIND_DMCACHE, KNOBS\n",
        "daemon/status.py": 'def f(kind):\n    return kind == "lvmcache"\n',
        "sim/runner.py": "from cachepilot.capabilities import KIND_BCACHE\n",  # may pick the kind it models
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    got = sorted(_checker().check(pkg))
    assert [g.split(": ", 1)[0] for g in got] == [f"{pkg / 'actuators/promote.py'}:1", f"{pkg / 'daemon/status.py'}:2",
                                                  f"{pkg / 'engine/lifetime.py'}:2"]
    assert "imports KIND_DMCACHE" in got[0] and "the kind name 'lvmcache'" in got[1]
