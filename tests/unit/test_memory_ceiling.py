"""The daemon under the unit's memory ceiling (issue 33, Deliver 5): the real daemon (`run --no-probe --dry-run`)
runs under prlimit with RLIMIT_AS = the unit's MemoryMax (512 MiB), is fed each hostile input within the documented
caps through the paths it takes them in (a reload of a policy, the control socket, the state file at start), and
must keep running on its last good state, answer `status` in one short answer, and refuse in one short line.

On main before this change: a reload of a 4 MiB policy whose pin.paths is one long list was refused with a "line"
of megabytes (`cachepilot reload`'s stderr, the log, and every later `status`, which repeats the policy error)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import cachepilot
from cachepilot.daemon.lock import HOST_LOCK_ENV

CLI = str(Path(sys.executable).parent / "cachepilot")
PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"
SERVICE = Path(cachepilot.__file__).parent / "data" / "cachepilot.service"
GOOD = "version: 1\ndefaults:\n  failure_model: recoverable\n"


def memory_max() -> int:
    m = re.search(r"^MemoryMax=(\d+)M$", SERVICE.read_text(), re.M)
    assert m, f"{SERVICE}: no MemoryMax=NM line"
    return int(m.group(1)) << 20


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


class Daemon:
    def __init__(self, d: Path) -> None:
        self.dir = d
        self.cfg = d / "c.yaml"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.cfg.write_text(f"version: 1\npolicies: [p.yaml]\nstate_dir: st\nsocket: ctl.sock\nmetrics: {{listen: ''}}"
                            f"\nobserve: [{json.dumps(str(self.dir))}]\n")
        env = {**os.environ, HOST_LOCK_ENV: str(self.dir / "host.lock")}
        self.proc = subprocess.Popen([PRLIMIT, f"--as={memory_max()}", "--", CLI, "run", "--config", str(self.cfg),
                                      "--no-probe", "--dry-run"], stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while cli("status", "--config", str(self.cfg)).returncode != 0:
            assert self.proc.poll() is None, self.proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the daemon never answered"
            time.sleep(0.2)

    def status(self) -> dict[str, object]:
        """The daemon's status, checked alive and short (it repeats the last refusal)."""
        assert self.proc is not None and self.proc.poll() is None, "the daemon died"
        r = cli("status", "--config", str(self.cfg), "--json", timeout=10)
        assert r.returncode == 0, r.stderr[-600:]
        assert len(r.stdout) < 64 << 10, f"status is {len(r.stdout)} bytes"
        doc: dict[str, object] = json.loads(r.stdout)
        return doc

    def rss_mib(self) -> float:
        assert self.proc is not None
        kids = Path(f"/proc/{self.proc.pid}/status").read_text()  # prlimit execs the daemon in place: same pid
        return int(re.search(r"VmRSS:\s+(\d+) kB", kids).group(1)) / 1024  # type: ignore[union-attr]

    def stop(self) -> str:
        assert self.proc is not None
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        return err


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    (tmp_path / "p.yaml").write_text(GOOD)
    d = Daemon(tmp_path)
    d.start()
    yield d
    err = d.stop()
    assert "MemoryError" not in err and "Traceback" not in err, err[-2000:]


def refused_reload(d: Daemon, *words: str) -> None:
    t0 = time.monotonic()
    r = cli("reload", "--config", str(d.cfg))
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, f"exit {r.returncode}: {r.stderr[:600]}"
    assert len(lines[0]) < 400 and all(w in lines[0] for w in words), lines[0][:600]
    assert time.monotonic() - t0 < 30


def pin_list_policy() -> str:
    head = "version: 1\ndefaults:\n  promotion: {enabled: true}\n  pin:\n    max_bytes: 1GiB\n    paths:\n"
    return head + "    - a\n" * (((4 << 20) - len(head) - 64) // 8)


def many_lists_policy() -> str:
    """Just under 4 MiB of lists, each within the item cap (the node cap is what stops it)."""
    rule = "  - match: {device: d%d}\n    pin: {max_bytes: 1GiB, paths: [" + ",".join(["a"] * 9999) + "]}\n"
    out, i = ["version: 1\nvolumes:\n"], 0
    size = len(out[0])
    while size + len(rule) < (4 << 20) - 1024:
        out.append(rule % i)
        size += len(out[-1])
        i += 1
    return "".join(out)


@pytest.mark.parametrize(("make", "words"), [
    (pin_list_policy, ("defaults.pin.paths: too many items in one list",)),
    (many_lists_policy, ("more than 300000 YAML nodes",)),
])
def test_a_hostile_policy_reload_is_one_line_and_the_daemon_runs_on(daemon: Daemon, make: object,
                                                                   words: tuple[str, ...]) -> None:
    assert callable(make)
    (daemon.dir / "p.yaml").write_text(make())
    refused_reload(daemon, "reload refused, the running policy is kept", *words)
    status = daemon.status()
    assert daemon.rss_mib() < memory_max() / (1 << 20)
    (daemon.dir / "p.yaml").write_text(GOOD)  # and it takes a good one after
    r = cli("reload", "--config", str(daemon.cfg))
    assert r.returncode == 0, r.stderr
    assert status  # answered during the refusal's aftermath


def test_a_state_file_of_empty_objects_starts_fresh(tmp_path: Path) -> None:
    """8 MiB (the read cap) of {} as the state file: read at start, refused with one warning, fresh state."""
    st = tmp_path / "st"
    st.mkdir(mode=0o700)
    n = (8 << 20) // 3 - 100
    (st / "state.json").write_bytes(b'{"crc32":0,"state":[' + b"{}," * n + b"{}]}")
    (tmp_path / "p.yaml").write_text(GOOD)
    d = Daemon(tmp_path)
    d.start()
    try:
        d.status()
    finally:
        err = d.stop()
    assert "MemoryError" not in err and "Traceback" not in err, err[-2000:]
