"""Every file cachepilot writes goes through safeio's one output path (issue 33, case 1 and 2): a link another user
planted as the output, as its temporary or in the state directory's path is never followed, and modes are set on
the descriptor, never by path. The attacker is the unprivileged user nobody (setpriv), the victims are root's.

On main before this change: `simulate --trace-out` through a planted link clobbered the root-owned file (and created
one for a dangling link); a `state_dir` that is a link was followed; the textfile's temporary, swapped for a link
between its write and its ``chmod``, made the victim 0644."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachepilot.daemon.lock import DaemonLock
from cachepilot.daemon.state import StateFile
from cachepilot.errors import UserError
from cachepilot.exporter.families import GaugeMetricFamily
from cachepilot.exporter.registry import Registry
from cachepilot.exporter.textfile import write_textfile
from cachepilot.fsfiles import generation
from cachepilot.safeio import UnsafeOutput, open_stream, write_atomic
from cachepilot.trace import TraceWriter

CLI = str(Path(sys.executable).parent / "cachepilot")
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

if os.geteuid() != 0:  # fail loudly: these cases are about root writing where another user points
    pytest.fail("tests/unit/test_output_paths.py needs root (chown, setpriv to nobody)", pytrace=False)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky directory everyone may write in, as /tmp (its own, so the test leaves /tmp alone)."""
    d = Path(tempfile.mkdtemp(prefix="cp-out-"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory of root's that nobody can reach (pytest's tmp_path is under a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="cp-out-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def victim(tmp_path: Path) -> Path:
    v = tmp_path / "secret"
    v.write_text("precious\n")
    v.chmod(0o600)
    return v


def as_nobody(*argv: str) -> None:
    subprocess.run([*AS_NOBODY, *argv], check=True, timeout=10)


def one_line(r: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    lines = r.stderr.splitlines()
    assert r.returncode == code and len(lines) == 1, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr and all(w in lines[0] for w in words), lines[0]
    return lines[0]


# ------------------------------------------------------------------ traces: simulate --trace-out, record --out
def test_simulate_trace_out_through_a_planted_link_is_refused(tmp_path: Path, shared: Path) -> None:
    v = victim(tmp_path)
    as_nobody("ln", "-s", str(v), str(shared / "t.cptrace"))
    r = subprocess.run([CLI, "simulate", "--workload", "varmail", "--trace-out", str(shared / "t.cptrace")],
                       capture_output=True, text=True, timeout=120)
    one_line(r, 2, "a symbolic link is there: refusing")
    assert v.read_text() == "precious\n" and stat.S_IMODE(v.stat().st_mode) == 0o600


def test_a_dangling_planted_link_creates_nothing(tmp_path: Path, shared: Path) -> None:
    target = tmp_path / "made-by-root"
    as_nobody("ln", "-s", str(target), str(shared / "t.cptrace"))
    with pytest.raises(UnsafeOutput, match="a symbolic link is there"):
        TraceWriter(shared / "t.cptrace")  # what `record --out` opens
    assert not target.exists()


def test_another_users_file_in_a_sticky_directory_is_not_replaced(shared: Path) -> None:
    as_nobody("sh", "-c", f"echo theirs > {shared / 't.cptrace'}")
    with pytest.raises(UnsafeOutput, match=f"belongs to uid {NOBODY}"):
        TraceWriter(shared / "t.cptrace")
    assert (shared / "t.cptrace").read_text() == "theirs\n"


def test_an_output_in_a_directory_others_may_write_without_sticky_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(UnsafeOutput, match="lets another user replace"):
        TraceWriter(d / "t.cptrace")
    os.chown(d, NOBODY, NOBODY)
    d.chmod(0o755)  # another user's own directory: they could swap anything in it
    with pytest.raises(UnsafeOutput, match=f"owner uid {NOBODY}"):
        write_atomic(d / "x", b"x", "thing")
    assert list(d.iterdir()) == []


def test_our_own_old_trace_is_replaced_and_a_device_written_in_place(tmp_path: Path) -> None:
    out = tmp_path / "t.cptrace"
    out.write_bytes(b"old")
    with open_stream(out, "trace") as f:
        f.write(b"new")
    assert out.read_bytes() == b"new" and stat.S_IMODE(out.stat().st_mode) == 0o644
    with open_stream("/dev/null", "trace") as f:  # a stream to a named device: written, not replaced
        f.write(b"x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# ------------------------------------------------------------------ state_dir: no link in any component
def test_a_state_dir_that_is_a_planted_link_is_refused(tmp_path: Path, shared: Path) -> None:
    real = tmp_path / "other-state"  # root's, with a state file of its own
    real.mkdir(mode=0o700)
    StateFile(real).write({"counters": {"theirs": 1}})
    before = (real / "state.json").read_bytes()
    as_nobody("ln", "-s", str(real), str(shared / "st"))
    with pytest.raises(UserError, match=f"{shared / 'st'} is a symbolic link: refusing"):
        DaemonLock(shared / "st").acquire()
    assert not (real / "cachepilot.lock").exists() and (real / "state.json").read_bytes() == before


def test_a_link_in_a_parent_of_state_dir_is_refused_by_the_cli_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "real" / "st").mkdir(parents=True, mode=0o700)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"version: 1\nstate_dir: {tmp_path / 'via' / 'st'}\nsocket: {tmp_path / 'ctl.sock'}\n"
                   "metrics: {listen: ''}\n")
    r = subprocess.run([CLI, "run", "--config", str(cfg), "--no-probe", "--dry-run"], capture_output=True,
                       text=True, timeout=30, env={**os.environ, "CACHEPILOT_HOST_LOCK": str(tmp_path / "h.lock")})
    one_line(r, 2, f"{tmp_path / 'via'} is a symbolic link: refusing")
    assert not (tmp_path / "real" / "st" / "cachepilot.lock").exists()


# ------------------------------------------------------------------ the metrics textfile: modes by descriptor
SWAPPER = """
import os, sys, time
d, target, until = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
while time.monotonic() < until:
    for n in os.listdir(d):
        if n.endswith(".tmp"):
            try:
                os.unlink(os.path.join(d, n)); os.symlink(target, os.path.join(d, n))
            except OSError:
                pass
"""


def one_gauge() -> Registry:
    reg = Registry()
    reg.register(type("One", (), {"collect": lambda self: [GaugeMetricFamily("cachepilot_test", "a test gauge", 1)]})())
    return reg


def test_textfile_temporary_swapped_for_a_link_chmods_nothing(tmp_path: Path, reachable: Path) -> None:
    """node_exporter's collector directory writable by its user (here nobody): root's textfile is refused there (it
    was written, and the race made the victim 0644 within a few hundred writes)."""
    v = victim(tmp_path)
    d = reachable / "textfile"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    reg = one_gauge()
    swapper = subprocess.Popen([*AS_NOBODY, sys.executable, "-c", SWAPPER, str(d), str(v), "8"])
    try:
        refused = 0
        t_end = time.monotonic() + 6
        while time.monotonic() < t_end and stat.S_IMODE(v.stat().st_mode) == 0o600:
            try:
                write_textfile(d / "cachepilot.prom", reg)
            except (OSError, UnsafeOutput):
                refused += 1
    finally:
        swapper.kill()
        swapper.wait()
    assert stat.S_IMODE(v.stat().st_mode) == 0o600 and v.read_text() == "precious\n"
    assert refused > 0


def test_textfile_in_roots_directory_is_written_0644(tmp_path: Path) -> None:
    reg = one_gauge()
    write_textfile(tmp_path / "cachepilot.prom", reg)
    f = tmp_path / "cachepilot.prom"
    assert stat.S_IMODE(f.stat().st_mode) == 0o644 and b"cachepilot_test 1.0" in f.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["cachepilot.prom"]  # no temporary left


# ------------------------------------------------------------------ hot-list exports to a path
def _state_with_one_hot_file(tmp_path: Path) -> Path:
    st = tmp_path / "st"
    st.mkdir(mode=0o700)
    f = tmp_path / "hot-file"
    f.write_bytes(b"x" * 4096)
    s = f.stat()
    fd = os.open(f, os.O_RDONLY)
    try:
        gen = generation(fd)
    finally:
        os.close(fd)
    dev = f"{os.major(s.st_dev)}:{os.minor(s.st_dev)}"
    StateFile(st).write({"volumes": {"v0": {"name": "v0", "dev": dev, "hot": [[s.st_ino, gen, 64, 4096]]}},
                         "counters": {}, "decisions": []})
    return st


def test_hotlist_export_to_a_path_writes_through_the_safe_helper(tmp_path: Path, shared: Path) -> None:
    st = _state_with_one_hot_file(tmp_path)
    v = victim(tmp_path)
    as_nobody("ln", "-s", str(v), str(shared / "hot.json"))
    r = subprocess.run([CLI, "hotlist", "export", "--state-dir", str(st), "--out", str(shared / "hot.json"), "v0"],
                       capture_output=True, text=True, timeout=60)
    one_line(r, 2, "a symbolic link is there: refusing")
    assert v.read_text() == "precious\n"
    out = tmp_path / "hot.json"
    r = subprocess.run([CLI, "hotlist", "export", "--state-dir", str(st), "--out", str(out), "v0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    doc = json.loads(out.read_text())
    assert [f["path"] for f in doc["files"]] == [str(tmp_path / "hot-file").lstrip("/")]
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
