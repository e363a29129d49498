"""Issue 34 item 6: the wheel's dependency floors are Debian 12's versions, which the .deb runs on. A virtualenv of
Debian's own Python with --system-site-packages sees exactly those packages (numpy 1.24.2, jsonschema 4.10.3,
zstandard 0.20.0, PyYAML 6.0, rich 13.3.1): the wheel installs there without pulling anything, `pip check` has nothing
to say about it, and the core of the unit tests passes against those versions (only pytest, hypothesis and
prometheus-client -- the tests' reference and parser of our exposition, no longer a dependency since the daemon
writes its own, issue 32 -- come from PyPI, at the versions of the project's own virtualenv)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from ops_support import ROOT

pytestmark = pytest.mark.ops

DEBIAN_PY = Path("/usr/bin/python3")
DEBIAN = {"numpy": "1.24.2", "jsonschema": "4.10.3", "zstandard": "0.20.0", "yaml": "6.0", "rich": "13.3.1"}
REQUIRES = {"PyYAML", "jsonschema", "rich", "numpy", "zstandard"}  # the wheel's dependencies, each one of DEBIAN's
# the core: policies (jsonschema), traces (zstandard), hotness tables (numpy), the daemon, the engine, the exporter
# (its exposition checked against prometheus-client's), the backends; ~20 s here
CORE = ["tests/unit/test_policy.py", "tests/unit/test_trace.py", "tests/unit/test_trace_v2.py",
        "tests/unit/test_hotness.py",
        *(f"tests/unit/test_daemon_{m}.py" for m in ("loop", "config", "state", "control", "acting", "adoption",
                                                     "reloads", "persist", "start", "intake", "guard", "metrics",
                                                     "pinning")),
        "tests/unit/test_knob_restore.py",
        "tests/unit/test_engine.py", "tests/unit/test_snapshot.py", "tests/unit/test_backends.py",
        "tests/unit/test_bad_input.py", "tests/ops/test_exporter.py"]


def run(*argv: str | Path, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def debian_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert DEBIAN_PY.is_file(), "Debian's /usr/bin/python3 is missing: make deps-system installs it"
    tmp = tmp_path_factory.mktemp("floors")
    venv = tmp / "venv"
    r = run(DEBIAN_PY, "-m", "venv", "--system-site-packages", venv)
    assert r.returncode == 0, r.stderr
    r = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "wheel", ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    [wheel] = (tmp / "wheel").glob("cachepilot-*.whl")
    r = run(venv / "bin/pip", "install", "-q", "--no-index", wheel)  # no index: every dependency must be Debian's
    assert r.returncode == 0, r.stdout + r.stderr
    tools = [f"{name}=={metadata.version(name)}" for name in ("pytest", "hypothesis", "prometheus-client")]
    r = run(venv / "bin/pip", "install", "-q", *tools)
    assert r.returncode == 0, f"cannot install {tools} from PyPI into the Debian venv: {r.stdout}{r.stderr}"
    return venv


def test_the_wheel_installs_over_debians_packages_and_pip_check_is_clean(debian_venv: Path) -> None:
    code = ("import importlib, json; print(json.dumps({m: (importlib.import_module(m).__file__, "
            "importlib.metadata.version({'yaml': 'PyYAML'}.get(m, m))) "
            f"for m in {sorted(DEBIAN)!r}}} | {{'cachepilot': (importlib.import_module('cachepilot').__file__, '')}} "
            "| {'requires': importlib.metadata.requires('cachepilot')}))")
    r = run(debian_venv / "bin/python", "-c", "import importlib.metadata; " + code, cwd=debian_venv)
    assert r.returncode == 0, r.stderr
    import json

    found = json.loads(r.stdout)
    for module, version in DEBIAN.items():
        path, have = found[module]
        assert path.startswith("/usr/lib/python3/dist-packages/") and have == version, (module, path, have)
    assert found["cachepilot"][0].startswith(str(debian_venv)), found["cachepilot"]
    requires = [r for r in found.pop("requires") if "extra ==" not in r]  # the test extras are not installed
    assert {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in requires} == REQUIRES
    r = run(debian_venv / "bin/pip", "check")
    # pip check looks at every system package too (Debian's own pygobject wants a pycairo bookworm does not
    # install): nothing may be said about cachepilot
    ours = [line for line in r.stdout.splitlines() if line.lower().startswith("cachepilot ")]
    assert not ours, r.stdout


def test_the_core_unit_tests_pass_against_debians_versions(debian_venv: Path) -> None:
    r = run(debian_venv / "bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *CORE, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout.splitlines()[-1] and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-500:]
