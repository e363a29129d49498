"""`cachepilot run` for real on this host: the real probe, ext4 on a loop device and no cache (the host kernel has
neither bcache nor dm), so the daemon runs observe-only — a real case of its own. Started as a subprocess with a
NOTIFY_SOCKET the test listens on, driven with signals, asked through its control socket by the real CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from bpf_support import BLOCK, LoopFs, blocks, child, fiemap, ftrace_events

from cachepilot.daemon.control import request

CLI = Path(sys.executable).with_name("cachepilot")
HOSTILE = b"hot\n\x1b[31mred\xff[bold]"
POLICY = """version: 1
defaults:
  discard_on_delete: {enabled: true, interval: 1s, min_extent: 4KiB}
  promotion: {enabled: true, rate: 1MiB, sieve_size: 1MiB}
"""


class Daemon:
    def __init__(self, tmp: Path, mount: Path) -> None:
        self.tmp = tmp
        self.policy = tmp / "policy.yaml"
        self.policy.write_text(POLICY)
        self.config = tmp / "cachepilot.yaml"
        self.config.write_text(
            f"version: 1\npolicies: [policy.yaml]\nstate_dir: state\nsocket: run/ctl.sock\ntick: 200ms\n"
            f"rescan: 1s\nstate_interval: 1s\nobserve: [{json.dumps(str(mount))}]\nmetrics: {{listen: ''}}\n")
        self.socket = tmp / "run" / "ctl.sock"
        self.notify_path = tmp / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(0.2)
        self.messages: list[str] = []  # read by a thread, as systemd would (an unread queue holds 10)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._closing = False
        self._reader.start()
        self.proc: subprocess.Popen[str] | None = None
        self.n = 0
        self.errs: dict[int, IO[str]] = {}

    def start(self, *extra: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        env = {**os.environ, "NOTIFY_SOCKET": str(self.notify_path)}
        self.n += 1
        err = open(self.tmp / f"stderr.{self.n}", "w+")  # a file, not a pipe: a full pipe would block the daemon
        p = subprocess.Popen([*prefix, str(CLI), "run", "--config", str(self.config), *extra], env=env,
                             stdout=subprocess.DEVNULL, stderr=err, text=True)
        self.errs[p.pid] = err
        if self.proc is None:
            self.proc = p
        return p

    def stderr(self, p: subprocess.Popen[str]) -> str:
        f = self.errs[p.pid]
        f.seek(0)
        return f.read()

    def _read(self) -> None:
        while not self._closing:
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._closing = True
        self._reader.join()
        self.notify.close()

    def wait_for(self, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(what in m for m in self.messages):
                return
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.05)
        err = self.stderr(self.proc) if self.proc else ""
        raise AssertionError(f"no {what!r} from the daemon within {timeout} s: {self.messages[-5:]} {err}")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(CLI), *args, "--socket", str(self.socket)], capture_output=True, text=True,
                              timeout=30, env={**os.environ, "COLUMNS": "300"})

    def stop(self) -> tuple[int, str]:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        err = self.stderr(self.proc)
        self.proc = None
        return rc, err


@pytest.fixture
def daemon(tmp_path: Path, loopfs: LoopFs) -> Iterator[Daemon]:
    d = Daemon(tmp_path, loopfs.mount)
    yield d
    if d.proc is not None and d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()
    d.close()


def test_run_observe_only_status_top_explain_reload_stop(daemon: Daemon, loopfs: LoopFs) -> None:
    daemon.start()
    daemon.wait_for("READY=1")
    daemon.wait_for("WATCHDOG=1")  # pinged from the loop

    # a hot file with a hostile name (read with O_DIRECT from another process) and a deleted 1 MiB file
    hot = loopfs.path(HOSTILE)
    assert isinstance(hot, bytes)
    with open(hot, "wb") as f:
        f.write(os.urandom(64 << 10))
    with open(loopfs.path("doomed"), "wb") as f:
        f.write(os.urandom(1 << 20))
    os.sync()
    child("import os,sys,mmap\nb=mmap.mmap(-1,65536)\nfor _ in range(20):\n"
          " fd=os.open(sys.argv[1].encode('utf-8','surrogateescape'),os.O_RDONLY|os.O_DIRECT)\n"
          " os.readv(fd,[b]); os.close(fd)", os.fsdecode(hot))
    os.unlink(loopfs.path("doomed"))
    os.sync()

    # status: observe-only, the loop device, answered from the snapshot fast
    deadline = time.monotonic() + 15
    while True:
        t0 = time.monotonic()
        s = request(daemon.socket, {"cmd": "status"})
        took = time.monotonic() - t0
        assert took < 0.2, f"status took {took:.3f} s"
        if s["tracked_files"] >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert s["observe_only"] is True and s["probe"]["attached"] is True
    assert [(v["kind"], v["observe_only"], v["mountpoint"]) for v in s["volumes"]] == [
        ("none", True, str(loopfs.mount))]
    r = daemon.cli("status")
    assert r.returncode == 0 and "observe-only (no cached volume)" in r.stdout, r.stderr
    r = daemon.cli("status", "--json")
    assert json.loads(r.stdout)["pid"] == daemon.proc.pid  # type: ignore[union-attr]

    # top: the hot file, its path found by handle and escaped (no raw control character reaches the terminal)
    deadline = time.monotonic() + 15
    while True:
        r = daemon.cli("top", "--once")
        if "red" in r.stdout or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert r.returncode == 0, r.stderr
    assert "hot\\x0a\\x1b[31mred\\xff[bold]" in r.stdout, r.stdout
    assert "\x1b" not in r.stdout and "\n\x1b" not in r.stdout

    # explain: the delete became a discard decision, not carried out (observe-only)
    deadline = time.monotonic() + 15
    while True:
        r = daemon.cli("explain", "--since", "5m")
        if "discard" in r.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.returncode == 0 and "discard" in r.stdout and "not carried out: observe-only volume" in r.stdout, r.stdout

    # a second daemon refuses, naming the first one's pid
    second = daemon.start()
    second.wait(timeout=30)
    err = daemon.stderr(second)
    assert second.returncode == 3 and f"another cachepilot daemon is running (pid {daemon.proc.pid}," in err, err  # type: ignore[union-attr]

    # SIGHUP with a broken policy keeps the old one, says why, and the daemon keeps answering
    daemon.policy.write_text("version: 1\ndefaults:\n  failure_model: yolo\n")
    daemon.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while request(daemon.socket, {"cmd": "status"})["policy"]["last_error"] is None:
        assert time.monotonic() < deadline, f"reload error never reported: {request(daemon.socket, {'cmd': 'status'})}"
        time.sleep(0.2)
    s = request(daemon.socket, {"cmd": "status"})
    assert s["policy"]["last_error"].startswith(f"{daemon.policy}:3: defaults.failure_model")
    assert s["policy"]["generation"] == 1 and s["counters"]["reloads_failed"] == 1

    # SIGTERM: exit 0, STOPPING=1, the state file holds the hot file
    ino = os.stat(hot).st_ino
    rc, err = daemon.stop()
    assert rc == 0, err
    assert "reload failed, keeping the running policy" in err and "Traceback" not in err
    daemon.wait_for("STOPPING=1", timeout=5)
    state = json.loads((daemon.tmp / "state" / "state.json").read_text())["state"]
    (vol,) = state["volumes"].values()
    assert ino in [h[0] for h in vol["hot"]]
    assert not daemon.socket.exists()

    # restart: reads the state back and re-warms from the hot list
    daemon.policy.write_text(POLICY)
    daemon.messages.clear()
    daemon.start()
    daemon.wait_for("READY=1")
    rc, err = daemon.stop()
    assert rc == 0 and "re-warming" in err and "starting fresh" not in err, err


def test_unusable_probe_fails_at_start_with_the_reason(daemon: Daemon) -> None:
    """No BTF (hidden in a private mount namespace): exit 3, one line naming the reason, no traceback."""
    p = daemon.start(prefix=("unshare", "-m", "--", "sh", "-c",
                             'mount -t tmpfs none /sys/kernel/btf && exec "$@"', "sh"))
    p.wait(timeout=60)
    err = daemon.stderr(p)
    assert p.returncode == 3, err
    assert "cannot run: the eBPF probe is unusable: the kernel has no BTF" in err and "Traceback" not in err
    assert not any("READY=1" in m for m in daemon.messages)


def test_bad_config_exits_2_naming_file_and_line(tmp_path: Path, bpf_env: None) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: 1\ntick: 1s\nstate_dri: /tmp/x\n")
    r = subprocess.run([str(CLI), "run", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith(f"cachepilot: {cfg}:3: state_dri: unknown key"), r.stderr


def test_sigkill_at_random_moments_then_restart(daemon: Daemon) -> None:
    """Crash safety of what the daemon owns on the host: SIGKILLed at random moments (state written every 200 ms
    here), it leaves a state file that is whole (old or new, never torn), a stale socket and a lock the kernel
    released; the next start takes over without help and reads the state back."""
    import random

    from cachepilot.daemon.state import StateFile

    daemon.config.write_text(daemon.config.read_text().replace("state_interval: 1s", "state_interval: 200ms"))
    rng = random.Random(7)  # noqa: S311 - kill timing, not secrets
    for i in range(6):
        daemon.messages.clear()
        p = daemon.start()
        daemon.proc = p
        daemon.wait_for("READY=1")
        time.sleep(rng.uniform(0.05, 1.2))
        p.kill()
        p.wait(timeout=30)
        doc, why = StateFile(daemon.tmp / "state").read()
        assert doc is not None or why.startswith("no state file"), f"round {i}: {why}"
        log = daemon.stderr(p)
        if i > 0:
            assert "starting fresh" not in log and "state file " in log, f"round {i}: {log}"
        assert "Traceback" not in log
        daemon.proc = None
    assert daemon.socket.exists()  # stale, from the last SIGKILL: the next start replaces it
    daemon.messages.clear()
    daemon.start()
    daemon.wait_for("READY=1")
    rc, err = daemon.stop()
    assert rc == 0 and "Traceback" not in err, err


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_unprivileged_sync_flood_cannot_stall_ticks_or_grow_memory(daemon: Daemon, loopfs: LoopFs) -> None:
    """nobody calls sync_file_range as fast as it can on a watched filesystem for 4 s: the kernel counts the calls
    (never queued), so the daemon's ticks stay short and its memory flat."""
    from test_storm import storm

    p = daemon.start()
    daemon.wait_for("READY=1")
    path = loopfs.path("flooded")
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    os.chmod(path, 0o644)
    time.sleep(1.0)  # a few ticks in: the baseline
    rss0 = _rss_mib(p.pid)
    fd = os.open(path, os.O_RDONLY)
    try:
        pid, r = storm(fd, 4.0)
        ticks: list[float] = []
        rss: list[float] = []
        end = time.monotonic() + 4.5
        while time.monotonic() < end:
            ticks.append(request(daemon.socket, {"cmd": "status"})["last_tick"]["duration_s"])
            rss.append(_rss_mib(p.pid))
            time.sleep(0.25)
        os.waitpid(pid, 0)
        ok, _ = (int(x) for x in os.read(r, 100).split())
        os.close(r)
    finally:
        os.close(fd)
    print(f"flood: {ok} calls; ticks max {max(ticks) * 1000:.1f} ms; RSS {rss0:.1f} -> max {max(rss):.1f} MiB")
    assert ok > 10_000, f"the flood made only {ok} calls"
    # seconds is the failure (a drain that queued every call took 1.9 s per poll); a tick here is ~10 ms idle, up to
    # ~0.1 s with two lab guests on the two cores (the drain's RCU grace period waits longer on a busy host)
    assert max(ticks) < 1.0, f"tick durations under the flood: {ticks}"
    assert max(rss) - rss0 < 16, f"RSS {rss0:.1f} MiB -> {rss}"
    rc, err = daemon.stop()
    assert rc == 0 and "Traceback" not in err, err


def discards_settled(daemon: Daemon, deleted: list[float], sizes: list[int]) -> list[tuple[float, int]]:
    """The discard decisions (time, bytes) since the first delete, once every delete has one at or after it and none
    came for 2 s; at most 11 s on: long enough for a batch interval to pass, so the old behaviour (a batch at its
    interval) gets its chance and fails on its latency. (A fixed 11 s wait spent ~8 s of the suite after the last
    decision.)"""
    deadline = time.monotonic() + 11
    while True:
        decisions = request(daemon.socket, {"cmd": "explain", "since": deleted[0] - 1})["decisions"]
        found = [(d["ts"], int(d["action"].split("bytes=")[1].split(":")[0])) for d in decisions
                 if d["kind"] == "discard"]
        each = all(any(ts >= t and b >= n for ts, b in found) for t, n in zip(deleted, sizes, strict=True))
        if (each and time.time() - max(ts for ts, _ in found) >= 2) or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def test_delete_becomes_a_discard_right_after_the_commit_that_frees_it(daemon: Daemon, loopfs: LoopFs) -> None:
    """The daemon's real loop at the shipped tick and discard settings (only min_extent lowered for 4 KiB-block
    files): each delete, committed by the workload's next fsync as a file server's would be, becomes its discard
    decision within a second (p50), not at the next batch (the decision's time is when its FITRIM would be issued;
    this volume is observe-only, so none is)."""
    daemon.policy.write_text("version: 1\ndefaults:\n  discard_on_delete: {min_extent: 4KiB}\n")
    daemon.config.write_text(daemon.config.read_text().replace("tick: 200ms", "tick: 1s"))
    sizes = [(i + 1) * 64 << 10 for i in range(8)]  # distinct sizes: each decision names its file by its bytes
    for i, n in enumerate(sizes):
        with open(loopfs.path(f"victim{i}"), "wb") as f:
            f.write(os.urandom(n))
    os.sync()
    daemon.start()
    daemon.wait_for("READY=1")
    time.sleep(1.5)
    victims = [loopfs.path(f"victim{i}") for i in range(len(sizes))]
    victim_blocks = blocks([(p, n) for v in victims for _, p, n in fiemap(v)])
    owners = {os.stat(v).st_ino for v in victims}
    deleted: list[float] = []
    # the kernel's own record of every extent freed on the volume meanwhile (ext4_free_blocks): what the discards
    # must add up to, exactly
    with ftrace_events("ext4", ("ext4_free_blocks",), f"dev == {loopfs.dev}") as frees:
        for i, victim in enumerate(victims):
            t = time.time()
            os.unlink(victim)
            fd = os.open(loopfs.path("log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # the workload's next fsync
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            os.close(fd)
            deleted.append(t)
            time.sleep(1.3 + 0.37 * (i % 3))  # not in step with the tick
        found = discards_settled(daemon, deleted, sizes)
    # Every freed block once per time it was freed. Besides the victims' data, ext4 may free a metadata block: the
    # log's appends land where the allocator finds room and, fragmented past the four extents an inode holds, the
    # log gets an extent-tree leaf block; when its extents merge back to four, ext4 frees that leaf
    # (ext4_ext_try_to_merge_up: METADATA|FORGET, from a kernel worker). It is free space whose transaction committed
    # like any other: a correct discard of 4 KiB, sometimes of a block a victim's discard covered before the leaf
    # reused it. Traced on 2026-11-26: in 2 of 6 runs the one extra block was that leaf (a 4-8 KiB extra in 4 of 6
    # earlier runs); it depends on where the allocator put the appends, not on the daemon, which writes nothing to
    # this observe-only volume. The victims' own data is exactly their FIEMAP extents, each block once.
    data = [(int(r.fields["block"]), int(r.fields["count"])) for r in frees if "METADATA" not in r.fields["flags"]]
    assert blocks(data) == victim_blocks and sum(n for _, n in data) == len(victim_blocks), (data, victim_blocks)
    meta = [r.fields for r in frees if "METADATA" in r.fields["flags"]]
    assert {int(f["ino"]) for f in meta} <= owners | {os.stat(loopfs.path("log")).st_ino}, meta
    freed = sum(int(r.fields["count"]) for r in frees) * BLOCK
    print(f"freed meanwhile: the victims' {len(victim_blocks)} blocks, and metadata blocks {meta}")
    assert sum(b for _, b in found) == freed, (found, data, meta)
    lat = []
    for t, n in zip(deleted, sizes, strict=True):
        after = [ts for ts, b in found if ts >= t and b >= n]
        assert after, (t, n, found)
        lat.append(min(after) - t)
    lat.sort()
    p50 = lat[len(lat) // 2]
    print(f"delete -> discard decision latency (s): p50 {p50:.3f}, max {lat[-1]:.3f}, all {lat}")
    assert p50 <= 1.0 and lat[-1] <= 2.0, lat
    rc, err = daemon.stop()
    assert rc == 0, err
