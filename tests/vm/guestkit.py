"""Helpers shared by the scripts that run inside the lab guest (tests/vm/daemon/, tests/vm/demo/,
tests/bench/guest/): their results go to the host as key=value lines; they poll the guest's state."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable
from pathlib import Path


def say(key: str, value: object) -> None:
    """One result for the host (tests/vm/conftest.py's LabResult.values)."""
    print(f"{key}={value}", flush=True)


def wait(pred: Callable[[], object], timeout: float, step: float = 0.25) -> bool:
    """Poll pred until it is true or timeout seconds have passed; whether it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def cli_in_process(socket: Path, *args: str) -> tuple[int, str]:
    """`cachepilot ARGS --socket SOCKET` run by the CLI's own code in this process (a new python per call costs tens
    of seconds under TCG): its exit code and everything it printed."""
    from cachepilot.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main([*args, "--socket", str(socket)])
    return rc, out.getvalue()
