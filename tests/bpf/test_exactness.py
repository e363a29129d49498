"""What the probe promises, held exactly: max_files files in one tick are all tracked; a lone delete wakes poll(-1)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from bpf_support import LoopFs, child, settle

from cachepilot.events import Delete, HotnessDelta
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf


def test_max_files_in_one_tick_are_all_tracked(bpf_env: None, watched: LoopFs) -> None:
    n = 10000
    with Probe(max_files=n) as p:
        p.watch_volume(watched.dev)
        d = watched.path("many")
        os.mkdir(d)
        names = [os.path.join(d, str(i)) for i in range(n)]
        for name in names:
            with open(name, "wb") as f:
                f.write(b"z" * 4096)
        settle(p)
        before = p.drops().hotness_map_full
        child(
            "import mmap, os, sys\nbuf = mmap.mmap(-1, 4096)\nfor n in sorted(os.listdir(sys.argv[1])):\n"
            "    fd = os.open(os.path.join(sys.argv[1], n), os.O_RDONLY | os.O_DIRECT); os.preadv(fd, [buf], 0)\n"
            "    os.close(fd)",
            str(d),
        )
        tracked = {e.key.ino for e in p.drain() if isinstance(e, HotnessDelta) and e.read_bytes == 4096}
        assert p.drops().hotness_map_full == before
        assert tracked == {os.stat(name).st_ino for name in names}


def test_a_lone_delete_wakes_a_waiting_poll(bpf_env: None, watched: LoopFs) -> None:
    path = str(watched.path("lone"))
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    ino = os.stat(path).st_ino
    p = Probe(max_files=64)
    p.watch_volume(watched.dev)
    settle(p)
    got: list = []

    def wait() -> None:  # every poll(-1) blocks until something wakes it (a journal commit may come first)
        while not any(isinstance(e, Delete) for e in got):
            got.extend(p.poll(-1))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    child("import os, sys\nos.unlink(sys.argv[1])", path)
    waiter.join(timeout=5)
    assert not waiter.is_alive(), "poll(-1) did not return after a delete"
    assert [e.key.ino for e in got if isinstance(e, Delete)] == [ino]
    p.close()


def commit_storm(p: Probe, path: str) -> tuple[int, int, float]:
    """2 s of 4 KiB appends + fsync on ``path`` (a journal commit each) from another process (the probe ignores its
    own), polled with a 1 s time-out: the journal commits seen, how often poll returned, and the seconds it ran."""
    from cachepilot.events import JournalCommit

    code = ("import os, sys, time\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
            "end = time.monotonic() + 2\nwhile time.monotonic() < end:\n"
            "    os.write(fd, b'c' * 4096); os.fsync(fd)")
    writer = subprocess.Popen([sys.executable, "-c", code, path])
    commits = returns = 0
    t0 = time.monotonic()
    while writer.poll() is None:
        commits += sum(isinstance(e, JournalCommit) for e in p.poll(1000))
        returns += 1
    seconds = time.monotonic() - t0
    for _ in range(3):
        commits += sum(isinstance(e, JournalCommit) for e in p.poll(100))
    assert writer.returncode == 0
    assert commits >= 200, f"only {commits} journal commits in 2 s of appends + fsync"
    return commits, returns, seconds


def test_a_commit_storm_wakes_the_consumer_at_most_every_20_ms(bpf_env: None, watched: LoopFs) -> None:
    """Appends + fsync on a fresh file make a journal commit each: with the kernel's adaptive wakeup every commit
    woke the consumer (thousands of polls a second, a third of a core in user space); now a wakeup at most every
    20 ms (or at a quarter of the ring). Every commit still arrives."""
    path = str(watched.path("commits"))
    with Probe(max_files=64) as p:
        p.watch_volume(watched.dev)
        settle(p)
        commits, returns, seconds = commit_storm(p, path)
        # one wakeup per 20 ms is 50 a second, plus the level-triggered second look when data came meanwhile
        # (before: one per commit, about as many as the commits)
        assert returns <= 100 * seconds + 10, f"poll returned {returns} times in {seconds:.1f} s for {commits} commits"


def test_a_drain_running_all_the_time_loses_no_increment(bpf_env: None, watched: LoopFs) -> None:
    """Drains in a tight loop while rounds of 20 000 direct reads run: every read is counted exactly once (the programs
    count into one half of the table while the other is drained; before, increments landing between a chunk's copy and
    its reset were lost: 229 of 29 699 here)."""
    files, reads = 8, 20000
    d = watched.path("drainrace")
    os.mkdir(d)
    for i in range(files):
        with open(os.path.join(d, str(i)), "wb") as f:
            f.write(b"r" * 4096)
    with Probe(max_files=1024) as p:
        p.watch_volume(watched.dev)
        settle(p)
        p.drain_hotness_array()
        got_bytes, got_score, drains = 0, 0, 0
        stop = threading.Event()

        def drain_all_the_time() -> None:
            nonlocal got_bytes, got_score, drains
            while not stop.is_set():
                a = p.drain_hotness_array()
                got_bytes += int(a["rb"].sum())
                got_score += int(a["rs"].sum())
                drains += 1

        t = threading.Thread(target=drain_all_the_time)
        t.start()
        rounds = 0
        try:  # rounds of reads until the drains have raced them enough (a loaded host gives the thread few turns)
            while drains <= 20 and rounds < 20:
                child(
                    "import mmap, os, sys\nbuf = mmap.mmap(-1, 4096)\nd, files, reads = sys.argv[1], int(sys.argv[2]), "
                    "int(sys.argv[3])\nfds = [os.open(os.path.join(d, str(i)), os.O_RDONLY | os.O_DIRECT) "
                    "for i in range(files)]\nfor k in range(reads):\n    os.preadv(fds[k % files], [buf], 0)\n",
                    str(d), str(files), str(reads),
                )
                rounds += 1
        finally:
            stop.set()
            t.join()
        a = p.drain_hotness_array()
        got_bytes += int(a["rb"].sum())
        got_score += int(a["rs"].sum())
    assert drains > 20  # it did race the reads
    reads *= rounds
    assert got_bytes == reads * 4096 and got_score == reads * 64


def test_the_daemons_wake_period_is_set_at_load_and_the_storm_wakes_it_a_few_times_a_second(
        bpf_env: None, loopfs: LoopFs) -> None:
    """The daemon reads the rings at most once a second (intake.MIN_POLL_GAP_NS), so it loads the probe with a
    wake period of a quarter of that (intake.RING_WAKE_EVERY_NS, cp_config.wake_every_ns): the same commit storm
    wakes a waiting poll about 4 times a second, not 50 (each an irq_work and an epoll wake-up in the kernel, and a
    return to Python). Every commit still arrives; a lone record after a quiet moment still wakes it at once."""
    from cachepilot.daemon.intake import RING_WAKE_EVERY_NS

    path = str(loopfs.path("commits-paced"))
    with Probe(max_files=64, wake_every_ns=RING_WAKE_EVERY_NS) as p:
        p.watch_volume(loopfs.dev)
        settle(p)
        commits, returns, seconds = commit_storm(p, path)
        # 4 wakeups a second and the edge-triggered look after each (20 ms pacing: 50 a second and more)
        per_s = 1e9 / RING_WAKE_EVERY_NS
        assert returns <= 2 * per_s * seconds + 4, f"poll returned {returns} times in {seconds:.1f} s"
        # quiet now (the last wakeup is more than a period old): a lone delete wakes a waiting poll at once
        time.sleep(2 * RING_WAKE_EVERY_NS / 1e9)
        lone = str(loopfs.path("lone-paced"))
        with open(lone, "wb") as f:
            f.write(b"x" * 4096)
        settle(p)
        time.sleep(2 * RING_WAKE_EVERY_NS / 1e9)
        got: list = []
        threading.Timer(0.1, lambda: child("import os, sys\nos.unlink(sys.argv[1])", lone)).start()
        t1 = time.monotonic()
        while not any(isinstance(e, Delete) for e in got) and time.monotonic() - t1 < 5:
            got.extend(p.poll(5000))
        assert any(isinstance(e, Delete) for e in got)
        assert time.monotonic() - t1 < 0.1 + RING_WAKE_EVERY_NS / 1e9 + 1.0


def test_a_stop_request_ends_a_long_poll_at_once(bpf_env: None, loopfs: LoopFs) -> None:
    """The daemon's loop gives its wait the whole time to the next tick (no 0.2 s slices): the stop flag's pipe is in
    the probe's epoll (Probe.wake_on), so a SIGTERM's stop request ends a long poll at once, from a signal handler
    as the daemon's is."""
    import signal

    from cachepilot.daemon.stopflag import StopFlag

    stop = StopFlag()
    with Probe(max_files=64) as p:
        p.watch_volume(loopfs.dev)
        settle(p)
        p.wake_on(stop.fileno())
        old = signal.signal(signal.SIGALRM, lambda *_: stop.set())
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            t0 = time.monotonic()
            p.poll(5000)
            took = time.monotonic() - t0
            t1 = time.monotonic()
            p.poll(-1)  # set for good: even an endless wait returns at once
            again = time.monotonic() - t1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert took < 1.0, f"a stop request 0.2 s into a 5 s poll ended it after {took:.2f} s"
        assert again < 0.5
