"""The demo's guest half (make demo, and tests/vm/test_demo_lab.py): `cachepilot run` with the shipped default policy
plus tests/vm/demo/demo-policy.yaml on the lab's bcache volume (write-back, origin slowed by dm-delay), a short mixed
workload (fsync'ed writes, deletes, a hot set, a scan, a write burst), then what the daemon did and what changed.
With --values it also prints key=value lines for the lab test."""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cachepilot.backends.inspect import block_name, parse_bcache_size
from cachepilot.daemon.control import request

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]
POLICIES = [ROOT / "policies" / "default.yaml", ROOT / "tests" / "vm" / "demo" / "demo-policy.yaml"]
VALUES = "--values" in sys.argv
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
origin = os.environ["LAB_ORIGIN_DEV"]
cli = str(Path(sys.executable).with_name("cachepilot"))
tmp = Path(tempfile.mkdtemp(prefix="cp-demo-"))
sock = tmp / "ctl.sock"
T0 = time.monotonic()
written = 0  # bytes the workload wrote (fsync'ed)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import wait  # noqa: E402


def value(key: str, v: object) -> None:
    if VALUES:
        print(f"{key}={v}", flush=True)


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:5.1f}s] {text}", flush=True)


def progress(label: str, done: int, total: int) -> None:
    """One '#' per step on one line (reads the same on a terminal and in a log)."""
    if done == 1:
        print(f"          {label:<28} ", end="", flush=True)
    print("#", end="\n" if done == total else "", flush=True)


def dirty() -> int:
    return parse_bcache_size((sysfs / "dirty_data").read_text())


def origin_sectors() -> int:
    return int(Path(f"/sys/block/{block_name(origin)[0]}/stat").read_text().split()[6])


def stats() -> dict[str, int]:
    return {f: int((sysfs / "stats_total" / f).read_text()) for f in ("cache_hits", "cache_misses")}



def write_file(path: Path, size: int) -> str:
    """Write, fsync, and return the checksum of what the kernel acknowledged."""
    global written
    data = os.urandom(size)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    written += size
    return hashlib.sha256(data).hexdigest()


def read_direct(path: Path) -> None:
    size = path.stat().st_size
    buf = mmap.mmap(-1, max(size, 4096))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        os.readv(fd, [buf])
    finally:
        os.close(fd)


def run_cli(*args: str) -> tuple[int, str]:
    """The CLI's own code in this process (a new python per call costs many seconds in a busy TCG guest)."""
    from cachepilot.cli import main

    out = io.StringIO()
    os.environ["COLUMNS"] = "140"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main([*args, "--socket", str(sock)])
    return rc, out.getvalue()


def decisions() -> list[dict]:  # type: ignore[type-arg]
    return request(sock, {"cmd": "explain"})["decisions"]


def mode() -> str:
    return (sysfs / "cache_mode").read_text().strip()


def hit_ratio(a: dict[str, int], b: dict[str, int]) -> str:
    h, m = b["cache_hits"] - a["cache_hits"], b["cache_misses"] - a["cache_misses"]
    return f"{h / (h + m):.0%} ({h} hits, {m} misses)" if h + m else "no reads"


# ---------------------------------------------------------------- the daemon
print(f"volume: {os.environ['LAB_CACHED_DEV']} = bcache over origin {origin} (dm-delay) with cache "
      f"{os.environ['LAB_CACHE_DEV']}; ext4 at {mnt}")
print("policies: " + " + ".join(str(p.relative_to(ROOT)) for p in POLICIES))
(tmp / "c.yaml").write_text("version: 1\npolicies: [" + ", ".join(str(p) for p in POLICIES) + "]\n"
                            "state_dir: state\nsocket: ctl.sock\ntick: 500ms\nrescan: 5s\nstate_interval: 5s\n"
                            "metrics: {listen: ''}\n")
err = open(tmp / "daemon.log", "w+")
say(f"starting the daemon: cachepilot run --config {tmp / 'c.yaml'}")
d = subprocess.Popen([cli, "run", "--config", str(tmp / "c.yaml")], stderr=err, stdout=subprocess.DEVNULL)
if not wait(lambda: sock.exists() and "ready" in (tmp / "daemon.log").read_text(), 150):
    err.seek(0)
    print(err.read())
    sys.exit(1)
say("daemon ready (eBPF probe attached, volume adopted)")
pinned = wait(lambda: (sysfs / "writeback_percent").read_text().strip() == "40"
              and parse_bcache_size((sysfs / "sequential_cutoff").read_text()) == 0
              and all((sysfs / "cache" / f"congested_{rw}_threshold_us").read_text().strip() == "0"
                      for rw in ("read", "write")), 90)
say(f"demo policy's knobs pinned and read back: writeback_percent=40 sequential_cutoff=0, congestion bypass off"
    f" ({'yes' if pinned else 'NO'})")
value("knobs_pinned", "yes" if pinned else "no")

s0, w0, m0 = stats(), origin_sectors(), mode()
work = mnt / "demo"
work.mkdir()
sums: dict[Path, str] = {}

# ---------------------------------------------------------------- 1: fsync'ed writes, then deletes
say("1/4 deletes: writing 4 MiB of temporary files and an fsync'ed log (write-back: dirty in the cache) ...")
(sysfs / "writeback_running").write_text("0")  # hold write-back so only the daemon's discards can drop dirty data
os.sync()
time.sleep(0.5)
base = dirty()
for i in range(2):
    write_file(work / f"tmp{i}", 2 * MIB)
    progress("temporary files", i + 1, 2)
with open(work / "app.log", "ab") as f:
    for i in range(8):
        chunk = os.urandom(16 * 1024)
        f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
        written += len(chunk)
        progress("log appends (fsync each)", i + 1, 8)
sums[work / "app.log"] = hashlib.sha256((work / "app.log").read_bytes()).hexdigest()
os.sync()
time.sleep(1)
d_before, w_del = dirty(), origin_sectors()
say(f"    dirty in the cache: {d_before / MIB:.1f} MiB; deleting the temporary files")
for i in range(2):
    os.unlink(work / f"tmp{i}")
os.sync()
t_del = time.monotonic()
wait(lambda: dirty() <= base + 512 * 1024, 30)
dropped_s = time.monotonic() - t_del
time.sleep(1)
d_after, origin_during = dirty(), (origin_sectors() - w_del) * 512
say(f"    dirty: {d_before / MIB:.1f} MiB -> {dirty() / MIB:.1f} MiB in {dropped_s:.1f} s; origin written meanwhile: "
    f"{origin_during // 1024} KiB (the deleted data never reached the origin)")
value("dirty_base", base)
value("dirty_before", d_before)
value("dirty_after", d_after)
value("origin_written_during_delete", origin_during)
(sysfs / "writeback_running").write_text("1")

# ---------------------------------------------------------------- 2: a hot set
say("2/4 hot set: 8 files of 256 KiB, 3 of them read again and again ...")
for i in range(8):
    sums[work / f"page{i}"] = write_file(work / f"page{i}", 256 * 1024)
for r in range(12):
    for i in range(3):
        read_direct(work / f"page{i}")
    progress("hot reads (O_DIRECT)", r + 1, 12)

# ---------------------------------------------------------------- 3: a scan
say("3/4 scan: one 16 MiB file read once, sequentially ...")
sums[work / "archive"] = write_file(work / "archive", 16 * MIB)
fd = os.open(work / "archive", os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, MIB)
for i in range(16):
    os.preadv(fd, [buf], i * MIB)
    if i % 4 == 3:
        progress("sequential read (MiB/4)", (i + 1) // 4, 4)
os.close(fd)

# ---------------------------------------------------------------- 4: a write burst over the exposure bound
say("4/4 burst: 48 MiB of fsync'ed writes, over the demo policy's 40 MiB exposure bound ...")
for i in range(12):
    sums[work / f"burst{i}"] = write_file(work / f"burst{i}", 4 * MIB)
    progress("burst (fsync each)", i + 1, 12)
def switch_done(target: str) -> bool:
    return any(x["kind"] == "set_write_policy" and x["status"] == "done" and f" {target}:" in x["action"]
               for x in decisions())


def early_drain() -> bool:
    """A drain started as dirty data neared the bound (engine/drains.py: before the byte bound forces write-through)."""
    return any(x["kind"] == "drain" and "before the byte bound" in x["action"] for x in decisions())


# The bound holds one of two ways: a drain started early enough (dirty data never reaches the bound), or, when the
# burst outruns the write-back, write-through until a drain has emptied the cache, then write-back again.
wait(lambda: switch_done("writethrough") or (early_drain() and dirty() < 40 * MIB // 2), 30, 0.5)
switched = switch_done("writethrough")
drained_early = early_drain()
say(f"    daemon drained early: {'yes' if drained_early else 'no'}; switched to write-through: "
    f"{'yes' if switched else 'no'} ...")
# a drain closes in write-through for its last stretch (no new dirty data while the tail is written back) and puts
# the mode it found back when the cache reads clean: without a switch, wait for that too
back = wait(lambda: (switch_done("writeback") or not switched) and "[writeback]" in mode(), 60, 0.5)
say(f"    write-back: {'yes' if back else 'no'} (cache_mode {mode()}, dirty {dirty() / MIB:.1f} MiB)")
value("switched_writethrough", "yes" if switched else "no")
value("drained_early", "yes" if drained_early else "no")
value("back_writeback", "yes" if back and "[writeback]" in mode() else "no")

# ---------------------------------------------------------------- what the daemon did
os.sync()
time.sleep(1)
s1, w1 = stats(), origin_sectors()
ds = decisions()
disc = [x for x in ds if x["kind"] == "discard"]
issued = sum(int(x["detail"].split("range(s), ")[1].split(" bytes")[0]) for x in disc if "FITRIM issued" in x["detail"])
landed = sum(1 for x in disc if x["status"] == "done")
promos = [x for x in ds if x["kind"] == "promote" and x["status"] == "done"]
switches = [x for x in ds if x["kind"] == "set_write_policy"]
bad = sum(1 for x in (tmp_sum for tmp_sum in sums.items()) if hashlib.sha256(x[0].read_bytes()).hexdigest() != x[1])
print()
print("== what the daemon did")
print(f"  discards: {len(disc)} FITRIM decision(s), {issued / MIB:.1f} MiB of freed extents issued, {landed} landed")
print(f"  dirty data that never reached the origin: {(d_before - d_after) / MIB:.1f} MiB dropped by discards; "
      f"origin written during the delete phase {origin_during // 1024} KiB")
print(f"  promotions: {len(promos)} done")
print(f"  mode switches ({len(switches)}):")
for x in switches:  # as `cachepilot explain` shows them (attempts refused during a drain are retried)
    if x["status"] == "done":
        print(f"    {x['action']} => done")
print(f"    ({sum(1 for x in switches if x['status'] != 'done')} more attempt(s) pending, refused or retried)")
print("== what changed")
print(f"  workload wrote {written / MIB:.1f} MiB (fsync'ed); origin written {(w1 - w0) * 512 / MIB:.1f} MiB "
      f"({w0 * 512 / MIB:.1f} MiB before the workload)")
print(f"  bcache hit ratio: before the workload {hit_ratio({'cache_hits': 0, 'cache_misses': 0}, s0)}; "
      f"during it {hit_ratio(s0, s1)}")
print(f"  cache_mode: {m0} -> {mode()}")
print(f"  files intact (sha256 vs what fsync acknowledged): {len(sums) - bad}/{len(sums)}")
print("== cachepilot status")
rc, text = run_cli("status")
print("\n".join("  " + x for x in text.splitlines()))
value("discard_decisions", len(disc))
value("discard_issued_bytes", issued)
value("discard_landed", landed)
value("promote_done", len(promos))
value("switch_decisions", len(switches))
value("switch_reasons", " | ".join(x["action"].replace("=", ":") for x in switches))
value("files_bad", bad)
value("status_rc", rc)
value("workload_bytes", written)
value("origin_written_total", (w1 - w0) * 512)

d.send_signal(signal.SIGTERM)
rc = d.wait(timeout=60)
say(f"daemon stopped (SIGTERM): exit {rc}; cache_mode {mode()}, "
    f"writeback_percent {(sysfs / 'writeback_percent').read_text().strip()}")
value("exit", rc)
value("mode_after", mode())
err.seek(0)
log = err.read()
value("traceback", "yes" if "Traceback" in log else "no")
if VALUES:
    print(log[-2500:])
