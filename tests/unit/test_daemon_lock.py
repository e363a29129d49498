"""The state directory and the locks (daemon/lock.py) as a hostile local user meets them: a planted symbolic link,
a directory others can write, a second daemon with a configuration of its own, an unprivileged or read-only start.

In-process where the lock alone is the subject; through the real CLI (`cachepilot run --no-probe --dry-run`) where
the exit code and the one line are; as the unprivileged user nobody (setpriv) where the attacker or the runner is
one. Needs root (to chown, mount, and drop to nobody), as the rest of the suite does here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachepilot.daemon.lock import HOST_LOCK, HOST_LOCK_ENV, LOCK_NAME, DaemonLock, host_lock_path, private_dir
from cachepilot.daemon.state import StateFile
from cachepilot.errors import FatalError, UserError

CLI = str(Path(sys.executable).parent / "cachepilot")
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chown, mount, setpriv")  # root here


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the user nobody can reach (pytest's tmp_path is root's, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="cp-lock-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def config(d: Path, state_dir: Path, socket: str = "ctl.sock") -> Path:
    c = d / f"c-{state_dir.name}.yaml"
    c.write_text(f"version: 1\nstate_dir: {state_dir}\nsocket: {socket}\nmetrics: {{listen: ''}}\n")
    c.chmod(0o644)
    return c


def run(cfg: Path, *, user: list[str] | None = None, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(user or []), CLI, "run", "--config", str(cfg), "--no-probe", "--dry-run"],
                          capture_output=True, text=True, timeout=timeout, env=env)


def one_line(r: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    lines = r.stderr.splitlines()
    assert r.returncode == code and len(lines) == 1, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr and all(w in lines[0] for w in words), lines[0]
    return lines[0]


def without_host_lock_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != HOST_LOCK_ENV}


# ------------------------------------------------------------------ the lock file: never follow a link
def test_a_planted_lock_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    st = tmp_path / "st"
    st.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (st / LOCK_NAME).symlink_to(victim)
    with pytest.raises(FatalError, match="symbolic link"):
        DaemonLock(st).acquire()
    assert victim.read_text() == "precious\n"


def test_the_state_file_is_never_read_through_a_link(tmp_path: Path) -> None:
    StateFile(tmp_path).write({"counters": {"n": 1}})
    (tmp_path / "state.json").rename(tmp_path / "elsewhere.json")
    (tmp_path / "state.json").symlink_to(tmp_path / "elsewhere.json")
    doc, why = StateFile(tmp_path).read()
    assert doc is None and "a symbolic link, refused" in why, why


# ------------------------------------------------------------------ the directory: nobody else may write in it
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_state_dir_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    st = tmp_path / "st"
    st.mkdir()
    st.chmod(mode)
    with pytest.raises(UserError, match=rf"state directory {st} is owned by uid 0 with mode {mode:o}"):
        DaemonLock(st).acquire()
    assert not (st / LOCK_NAME).exists()


def test_a_state_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    st = tmp_path / "st"
    st.mkdir(mode=0o700)
    os.chown(st, NOBODY, NOBODY)
    with pytest.raises(UserError, match=f"owned by uid {NOBODY}"):
        DaemonLock(st).acquire()


def test_a_parent_others_can_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)  # another user could rename st away and put their own in its place
    with pytest.raises(UserError, match=f"its parent {parent} .*lets another user replace it"):
        os.close(private_dir(parent / "st", "state directory"))
    parent.chmod(0o1777)  # sticky, as /tmp: only the owner may rename st
    os.close(private_dir(parent / "st", "state directory"))


def test_cli_refuses_a_world_writable_state_dir_with_one_line(shared: Path) -> None:
    st = shared / "st"
    st.mkdir()
    st.chmod(0o777)
    one_line(run(config(shared, st)), 2, f"state directory {st}", "not writable by group or others")


# ------------------------------------------------------------------ unprivileged and read-only starts
def test_non_root_run_with_a_root_owned_state_dir_is_one_line(shared: Path) -> None:
    st = shared / "st"
    st.mkdir(mode=0o755)
    line = one_line(run(config(shared, st), user=AS_NOBODY, env=without_host_lock_env()), 3, "cannot run")
    assert f"cannot lock {st}/{LOCK_NAME}: Permission denied" in line


def test_run_with_a_read_only_state_dir_is_one_line(tmp_path: Path) -> None:
    st = tmp_path / "st"
    st.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,mode=0700", "cp-test-ro", str(st)], check=True)
    try:
        line = one_line(run(config(tmp_path, st)), 3, "cannot run")
        assert f"cannot lock {st}/{LOCK_NAME}: Read-only file system" in line
    finally:
        subprocess.run(["umount", str(st)], check=True)


def test_non_root_run_in_its_own_state_dir_still_starts(shared: Path) -> None:
    """A non-root dry run (no host lock: it cannot write any cache's controls) works as before."""
    st = shared / "st"
    st.mkdir(mode=0o700)
    os.chown(st, NOBODY, NOBODY)
    assert host_lock_path() is not None  # the suite's own, for root
    p = subprocess.Popen([*AS_NOBODY, CLI, "run", "--config", str(config(shared, st, socket=f"{st}/ctl.sock")),
                          "--no-probe", "--dry-run"], stderr=subprocess.PIPE, text=True, env=without_host_lock_env())
    try:
        wait_for(st / "ctl.sock", p)
    finally:
        p.terminate()
        err = p.communicate(timeout=30)[1]
    assert p.returncode == 0 and "Traceback" not in err, err
    assert (st / LOCK_NAME).stat().st_uid == NOBODY


# ------------------------------------------------------------------ one daemon per host
def test_host_lock_is_fixed_for_root_and_absent_for_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOST_LOCK_ENV)
    assert host_lock_path() == HOST_LOCK == Path("/run/cachepilot/daemon.lock")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert host_lock_path() is None
    monkeypatch.setenv(HOST_LOCK_ENV, "/somewhere/else.lock")
    assert host_lock_path() == Path("/somewhere/else.lock")


def test_two_state_dirs_one_host_lock(tmp_path: Path) -> None:
    host = tmp_path / "run" / "daemon.lock"
    first = DaemonLock(tmp_path / "a", host)
    first.acquire()
    second = DaemonLock(tmp_path / "b", host)
    with pytest.raises(FatalError, match=rf"another cachepilot daemon is running \(pid {os.getpid()}, lock {host}\)"):
        second.acquire()
    assert second.fds == [] and not (tmp_path / "b" / LOCK_NAME).exists()  # refused before its own lock
    first.release()
    second.acquire()
    second.release()


def wait_for(sock: Path, p: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline, "the daemon never opened its control socket"
        time.sleep(0.1)


def test_a_second_daemon_with_its_own_config_is_refused(tmp_path: Path) -> None:
    """Its own state_dir and socket: today's per-directory lock alone let it start and steer the same caches."""
    a = subprocess.Popen([CLI, "run", "--config", str(config(tmp_path, tmp_path / "a", "a.sock")), "--no-probe",
                          "--dry-run"], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(tmp_path / "a.sock", a)
        b = run(config(tmp_path, tmp_path / "b", "b.sock"))
        one_line(b, 3, f"another cachepilot daemon is running (pid {a.pid}, lock {os.environ[HOST_LOCK_ENV]})")
        assert not (tmp_path / "b.sock").exists()
    finally:
        a.terminate()
        a.communicate(timeout=30)
    assert a.returncode == 0
