"""Lab: SIGKILL `cachepilot run` at random (seeded) moments while it promotes, discards and switches modes under a
workload, many rounds in one boot; then check every fsync-acknowledged file and what the caches were left with.
key=value lines on stdout. argv: [rounds] [seed]."""

from __future__ import annotations

import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cachepilot.backends.inspect import parse_bcache_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say, wait  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 10
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
tmp = Path(tempfile.mkdtemp(prefix="cp-crash-"))
POLICY = """version: 1
defaults:
  failure_model: destructive
  exposure: {max_dirty: 4MiB, max_age: 5m}
  # only_uncached false: nothing is bypassed here (cutoff 0), so by default bcache's own inserts would make every
  # promotion redundant and none would be killed mid-way; this test is about promotions interrupted
  promotion: {enabled: true, rate: 8MiB, sieve_size: 1MiB, only_uncached: false}
  discard_on_delete: {enabled: true, interval: 1s, min_extent: 4KiB}
  hysteresis: {min_switch_interval: 1s, resume_below: 0.5}
  # no congestion bypass (tests/vm/act/labkit.py, NO_CONGESTION): the dirty data the switches and drains act on
  knobs: {writeback_percent: 40, sequential_cutoff: 0, congested_read_threshold_us: 0,
          congested_write_threshold_us: 0}
"""
# The workload, its own process: files written and fsync'ed, then recorded (path, sha256) in an fsync'ed manifest;
# some deleted again (recorded first), small hot files read with O_DIRECT. Runs until killed.
WORKLOAD = r"""
import hashlib, mmap, os, random, sys
d, man = sys.argv[1], open(sys.argv[2], "a")
rng = random.Random(int(sys.argv[3]))
os.makedirs(d, exist_ok=True)
for i in range(4):
    p = f"{d}/hot{i}"
    data = os.urandom(128 * 1024)
    with open(p, "wb") as f:
        f.write(data); f.flush(); os.fsync(f.fileno())
    man.write(f"put {p} {hashlib.sha256(data).hexdigest()}\n"); man.flush(); os.fsync(man.fileno())
buf, live, n = mmap.mmap(-1, 128 * 1024), [], 0
while True:
    n += 1
    p = f"{d}/f{n}"
    data = os.urandom(rng.choice((64 * 1024, 512 * 1024, 2 << 20)))
    with open(p, "wb") as f:
        f.write(data); f.flush(); os.fsync(f.fileno())
    man.write(f"put {p} {hashlib.sha256(data).hexdigest()}\n"); man.flush(); os.fsync(man.fileno())
    live.append(p)
    if len(live) > 6:
        q = live.pop(rng.randrange(len(live)))
        man.write(f"del {q}\n"); man.flush(); os.fsync(man.fileno())
        os.unlink(q)
    fd = os.open(f"{d}/hot{n % 4}", os.O_RDONLY | os.O_DIRECT)
    os.readv(fd, [buf]); os.close(fd)
"""



def log_text() -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(tmp.glob("daemon*.log")))



def start(i: int) -> tuple[int, Path]:
    """The daemon, forked from this process with the controller already imported (a fresh python costs many
    seconds in a TCG guest; the fork still loads the probe and runs the daemon's own start-up)."""
    from cachepilot.cli import main

    path = tmp / f"daemon{i:02}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # before the fork: the parent reads it at once
    pid = os.fork()
    if pid == 0:
        os.dup2(fd, 2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        try:
            rc = main(["run", "--config", str(tmp / "c.yaml")])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            rc = 70
        os._exit(rc)
    os.close(fd)
    return pid, path


(tmp / "policy.yaml").write_text(POLICY)
(tmp / "c.yaml").write_text("version: 1\npolicies: [policy.yaml]\nstate_dir: state\nsocket: ctl.sock\ntick: 250ms\n"
                            "rescan: 5s\nstate_interval: 500ms\nmetrics: {listen: ''}\n")
say("wb_percent_before", (sysfs / "writeback_percent").read_text().strip())  # before any daemon pinned it
rng = random.Random(SEED)  # noqa: S311 (seeded kill moments, not crypto)
manifest = tmp / "manifest"
work = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(mnt / "crash"), str(manifest), str(SEED)])
# imported once, before the forks: each round's child would otherwise import (and compile) them again
import cachepilot.cli  # noqa: E402,F401
import cachepilot.commands.run  # noqa: E402,F401
import cachepilot.daemon.daemon  # noqa: E402,F401
import cachepilot.probe  # noqa: E402,F401

ACTION = re.compile(r"cachepilot: \w+: (promote|discard|set_write_policy|drain) ")
KIND = {"promote": "promote", "discard": "discard", "set_write_policy": "switch", "drain": "switch"}
t0 = time.monotonic()
killed_active = 0
acting = {"promote": 0, "discard": 0, "switch": 0}
for i in range(ROUNDS):
    # The workload waits while the daemon starts: with one vCPU under TCG it tripled the start (20-39 s instead of
    # 8 s, most of it the verifier), and a daemon without its probe sees none of that I/O anyway. It resumes at
    # ready, so every kill still lands while it writes, fsyncs, deletes and reads.
    work.send_signal(signal.SIGSTOP)
    pid, path = start(i)
    t_r = time.monotonic()
    # reconcile comes first (before the probe loads), then the probe; kill somewhere in the first ticks of acting
    up = wait(lambda p=path: "ready:" in p.read_text(errors="replace"), 60)  # type: ignore[misc]
    work.send_signal(signal.SIGCONT)
    t_up = time.monotonic() - t_r
    if not up:
        print(path.read_text(errors="replace")[-1500:], flush=True)
    time.sleep(rng.uniform(0.0, 2.5))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    lines = path.read_text(errors="replace").splitlines()
    after = lines[next((n for n, x in enumerate(lines) if "cachepilot: INFO: ready:" in x), len(lines)):]
    kinds = {KIND[m.group(1)] for x in after if (m := ACTION.match(x))}
    for k in kinds:
        acting[k] += 1
    killed_active += bool(kinds)
    print(f"round {i}: ready={up} after {t_up:.1f} s; killed while acting: {sorted(kinds)}", flush=True)
say("rounds", ROUNDS)
say("rounds_s", f"{time.monotonic() - t0:.1f}")
say("rounds_killed_while_acting", killed_active)
for k, n in acting.items():
    say(f"rounds_acting_{k}", n)
work.kill()
work.wait()

# the last start: reconcile, act a little, then stop cleanly
pid, path = start(ROUNDS)
say("final_ready", "yes" if wait(lambda: "ready:" in path.read_text(errors="replace"), 90) else "no")
time.sleep(3)
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
say("final_exit", os.waitstatus_to_exitcode(status))
say("mode_after", (sysfs / "cache_mode").read_text().strip())
say("wb_percent_after", (sysfs / "writeback_percent").read_text().strip())
say("writeback_running_after", (sysfs / "writeback_running").read_text().strip())
say("dirty_after", parse_bcache_size((sysfs / "dirty_data").read_text()))

# every fsync-acknowledged file, read back from the device (page cache dropped)
os.sync()
Path("/proc/sys/vm/drop_caches").write_text("3")
files: dict[str, str] = {}
for line in manifest.read_text().splitlines():
    parts = line.split()
    if parts[0] == "put" and len(parts) == 3:
        files[parts[1]] = parts[2]
    elif parts[0] == "del":
        files.pop(parts[1], None)
bad = [p for p, h in files.items() if not Path(p).exists() or hashlib.sha256(Path(p).read_bytes()).hexdigest() != h]
say("files_written", sum(1 for x in manifest.read_text().splitlines() if x.startswith("put ")))
say("files_checked", len(files))
say("files_bad", len(bad))
log = log_text()
say("switches_done", log.count("set_write_policy") and sum(
    1 for x in log.splitlines() if "set_write_policy" in x and "=> done" in x))
say("discards_done", sum(1 for x in log.splitlines() if "discard" in x and "=> done" in x))
say("promotes_done", sum(1 for x in log.splitlines() if "promote" in x and "=> done" in x))
say("interrupted_reported", log.count("interrupted at the last stop"))
say("wrote_none", sum(1 for x in log.splitlines() if "cache_mode:" in x and "-> none" in x))
say("traceback", "yes" if "Traceback" in log else "no")
print(path.read_text(errors="replace")[-2000:])
