"""The man page as build-package.sh generates it (controller/packaging/manpage.py, from the CLI's own parser):
the cache lifecycle commands with every option, and their exit codes in EXIT STATUS (issue 36: each workflow in the
man page). tests/ops/test_package.py checks the built package's page names every command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def page() -> str:
    r = subprocess.run([sys.executable, "-B", str(ROOT / "controller/packaging/manpage.py"),
                        str(ROOT / "controller/packaging/debian/cachepilot.8.in"), "0.0", "2026-11-29"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "controller")})
    assert r.returncode == 0, r.stderr
    return r.stdout.replace("\\-", "-")


def test_drain_detach_and_attach_are_in_the_man_page_with_their_options_and_exit_codes() -> None:
    text = page()
    for command, opts in (("drain", ("--deadline", "--end", "--rate", "--release", "--no-wait")),
                          ("detach", ("--deadline", "--accept-loss", "--no-wait")),
                          ("attach", ("VOLUME", "CACHE"))):
        section = text.split(f'.SS "cachepilot {command}"\n', 1)[1].split(".SS ", 1)[0]
        for opt in opts:
            assert opt in section, (command, opt)
    exit_status = text.split(".SH EXIT STATUS", 1)[1].split(".SH ", 1)[0]
    assert "drain and detach: 1 when the deadline passed" in exit_status
    assert "2 for a detach refused because a failed cache" in exit_status
