"""The real daemon (`cachepilot run --no-probe`, no cache on this host: observe-only) given files that are not
plain small files: a FIFO, /dev/zero, a sparse 5 GiB file as its state file; a configuration or policy replaced by
a FIFO or /dev/zero before a SIGHUP; a reload of 64 policy files of 4 MiB interrupted by SIGTERM. Each time the
daemon says so in one line, keeps its last good state, keeps ticking, and exits within 1 s of SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cachepilot.daemon.control import request

CLI = str(Path(sys.executable).parent / "cachepilot")
STOP_S = 1.0  # SIGTERM to exit
START_S = 30.0  # imports on a loaded machine take seconds; a blocked daemon never gets there
MAX_RSS_KIB = 400 << 10  # the daemon idles at ~100 MiB; the state file as /dev/zero took 13.6 GB
LIMIT_AS = 2 << 30  # and the kernel stops it well before (the machine is shared)
PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"  # util-linux


class Run:
    def __init__(self, tmp: Path, config: str = "") -> None:
        self.tmp = tmp
        self.config = tmp / "cachepilot.yaml"
        self.config.write_text(config or "version: 1\npolicies: [policy.yaml]\nstate_dir: state\nsocket: ctl.sock\n"
                               "tick: 200ms\nmetrics: {listen: ''}\n")
        (tmp / "policy.yaml").write_text("version: 1\n")
        (tmp / "state").mkdir(mode=0o700, exist_ok=True)
        self.socket = tmp / "ctl.sock"
        self.err = tmp / "stderr"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.err, "w") as err:  # a file, not a pipe: a full pipe would block the daemon
            argv = [PRLIMIT, f"--as={LIMIT_AS}", "--", CLI, "run", "--no-probe", "--config", str(self.config)]
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)

    def log(self) -> str:
        return self.err.read_text()

    def wait_for(self, what: str, timeout: float = START_S) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while what not in self.log():
            assert self.proc.poll() is None, f"daemon exited {self.proc.returncode}: {self.log()}"
            assert time.monotonic() < deadline, f"no {what!r} within {timeout} s: {self.log()}"
            time.sleep(0.05)

    def status(self) -> dict:  # type: ignore[type-arg]
        return request(self.socket, {"cmd": "status"})

    def ticks(self) -> int:
        return int(self.status().get("counters", {}).get("ticks", 0))

    def stop(self) -> tuple[int, float, int]:
        """(exit code, seconds from SIGTERM to exit, peak RSS in KiB)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        deadline = t0 + 30
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                took = time.monotonic() - t0
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode, took, usage.ru_maxrss
            assert time.monotonic() < deadline, f"no exit within 30 s of SIGTERM: {self.log()}"
            time.sleep(0.01)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    r = Run(tmp_path)
    yield r
    r.kill()


def _sparse(p: Path) -> None:
    p.write_bytes(b"")
    os.truncate(p, 5 << 30)


STATES: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (os.mkfifo, "a FIFO or pipe, not a regular file"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "a symbolic link, refused here"),  # O_NOFOLLOW: never read
    "sparse-5GiB": (_sparse, "state file of 5368709120 bytes, larger than 8 MiB"),
}


@pytest.mark.parametrize("kind", sorted(STATES))
def test_a_hostile_state_file_starts_fresh_in_bounded_time_and_memory(run: Run, kind: str) -> None:
    make, why = STATES[kind]
    state = run.tmp / "state" / "state.json"
    make(state)
    run.start()
    run.wait_for("ready:")
    lines = [ln for ln in run.log().splitlines() if "starting fresh" in ln]
    assert len(lines) == 1 and str(state) in lines[0] and why in lines[0], run.log()
    rc, took, rss = run.stop()
    assert rc == 0 and took <= STOP_S and rss <= MAX_RSS_KIB, (rc, took, rss, run.log())


def _replace(p: Path, make: Callable[[Path], None]) -> None:
    p.unlink()
    make(p)


RELOADS: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "config-fifo": ("cachepilot.yaml", os.mkfifo, "a FIFO or pipe, not a regular file"),
    "policy-fifo": ("policy.yaml", os.mkfifo, "a FIFO or pipe, not a regular file"),
    "config-dev-zero": ("cachepilot.yaml", lambda p: p.symlink_to("/dev/zero"), "a character device"),
    "policy-sparse": ("policy.yaml", _sparse, "larger than 4 MiB"),
}


@pytest.mark.parametrize("case", sorted(RELOADS))
def test_sighup_with_a_hostile_file_keeps_the_running_config_and_ticking(run: Run, case: str) -> None:
    name, make, why = RELOADS[case]
    run.start()
    run.wait_for("ready:")
    _replace(run.tmp / name, make)
    run.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
    run.wait_for("reload failed", timeout=5)
    (line,) = [ln for ln in run.log().splitlines() if "reload failed" in ln]
    assert str(run.tmp / name) in line and why in line, line
    s = run.status()
    assert s["policy"]["generation"] == 1 and why in s["policy"]["last_error"], s
    before = run.ticks()
    time.sleep(1.0)
    assert run.ticks() >= before + 3  # 200 ms ticks go on
    rc, took, rss = run.stop()
    assert rc == 0 and took <= STOP_S and rss <= MAX_RSS_KIB, (rc, took, rss, run.log())
    assert "Traceback" not in run.log()


def test_a_long_reload_lets_the_loop_tick_and_a_sigterm_ends_it_within_a_second(tmp_path: Path) -> None:
    """64 policy files of 4 MiB (the caps: each is read, none too big) take tens of seconds to parse: a SIGTERM
    in the middle ends the reload, not waits for it."""
    r = Run(tmp_path)
    try:
        r.start()
        r.wait_for("ready:")
        big = "version: 1\n" + ("# " + "x" * 77 + "\n") * ((4 << 20) // 80 - 1)
        (tmp_path / "big.yaml").write_text(big)
        r.config.write_text("version: 1\npolicies: [" + ", ".join(["big.yaml"] * 64) + "]\nstate_dir: state\n"
                            "socket: ctl.sock\ntick: 200ms\nmetrics: {listen: ''}\n")
        ticks = r.ticks()
        r.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        time.sleep(1.0)  # the next tick (200 ms) starts the reload
        # the parse runs beside the loop: the ticks go on meanwhile (they stopped for the whole parse before)
        time.sleep(2.0)
        assert r.ticks() >= ticks + 5, (ticks, r.ticks())
        rc, took, _ = r.stop()
        assert rc == 0 and took <= STOP_S, (rc, took, r.log())
        # stopped before the parse ended ("abandoned") or after it was applied, never in between, never a traceback
        said = ("reload abandoned: stopping" in r.log()) + ("INFO: reloaded" in r.log())
        assert said == 1 and "Traceback" not in r.log(), r.log()
    finally:
        r.kill()
