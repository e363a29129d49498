"""The test ids pytest collects for some arguments, as a separate `pytest --collect-only -q` sees them.

Several tests compare what ran somewhere else (a lab guest) or in what order with what this checkout collects. The
child must not inherit the caller's PYTEST_ADDOPTS: `-v` there (e.g. `PYTEST_ADDOPTS="-v --durations=0" make test`)
turns `-q`'s one id per line into a tree of `<Function ...>` lines, and the comparison then failed on a tree it could
not read (three lab tests in one such run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collected(args: list[str], timeout: float = 300, **env: str) -> list[str]:
    """The node ids (`path::name[params]`) collected for args, in collection order; env is added to this process's
    environment (PYTEST_ADDOPTS left out). A collection error raises with pytest's output."""
    child = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"} | env
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=child)
    if r.returncode != 0:
        raise AssertionError(f"pytest --collect-only {' '.join(args)}: rc {r.returncode}\n"
                             f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return [line for line in r.stdout.splitlines() if "::" in line]
