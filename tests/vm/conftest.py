"""Fixtures for tests that run in the lab guest (tests/vm/lab).

`lab.run(argv, recipe=..., mode=..., origin_delay_ms=..., timeout=...)` boots the guest, runs argv in it and
returns a LabResult; the guest's $LAB_OUT is copied to `result.out`. Guest scripts report values as
`key=value` lines on stdout (`result.values`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parent / "lab"
ROOT = LAB.parents[2]


@dataclass
class LabResult:
    rc: int
    stdout: str
    stderr: str
    out: Path
    values: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for line in self.stdout.splitlines():
            key, sep, value = line.partition("=")
            if sep and key and " " not in key:
                self.values[key] = value

    def int(self, key: str) -> int:
        assert key in self.values, f"guest did not report {key!r}; stdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return int(self.values[key])

    def explain(self) -> str:
        return f"rc={self.rc}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


class Lab:
    def __init__(self, tmp_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_factory

    def run(self, argv: list[str], recipe: str = "bcache", mode: str | None = None, origin_delay_ms: int = 0,
            timeout: float = 300, lab_args: tuple[str, ...] = (), cwd: Path = ROOT,
            env: dict[str, str] | None = None) -> LabResult:
        out = self._tmp.mktemp(f"lab-{recipe}")
        cmd = [sys.executable, str(LAB), "run", "--recipe", recipe, "--origin-delay-ms", str(origin_delay_ms),
               "--timeout", str(timeout), "--out", str(out), *lab_args]
        if mode:
            cmd += ["--mode", mode]
        # The runner enforces the timeout itself; ours is a backstop against a hung runner.
        proc = subprocess.run([*cmd, "--", *argv], capture_output=True, text=True, errors="replace",
                              timeout=timeout + 60, cwd=cwd, env={**os.environ, **(env or {})})
        return LabResult(proc.returncode, proc.stdout, proc.stderr, out)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    missing = []
    cache = ROOT / ".cache" / "lab"
    if not (cache / "kernel" / "vmlinux").is_file():
        missing.append(f"lab kernel ({cache / 'kernel'})")
    if not (cache / "initramfs.cpio").is_file():
        missing.append(f"lab initramfs ({cache / 'initramfs.cpio'})")
    if subprocess.run(["sh", "-c", "command -v qemu-system-x86_64"], capture_output=True).returncode:
        missing.append("qemu-system-x86_64")
    if missing:
        pytest.fail("the lab cannot run: missing " + ", ".join(missing) + "; run 'make deps'", pytrace=False)
    return Lab(tmp_path_factory)
