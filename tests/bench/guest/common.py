"""Guest-side helpers for the lab benchmarks: counters of the cached volume, the daemon, a per-second sampler.

Runs inside the lab guest (tests/vm/lab run ... -- .venv/bin/python tests/bench/guest/X.py); the result is one JSON
file in $LAB_OUT. Only reads sysfs and /proc, except where a benchmark sets up its configuration (cache mode,
mount options), which is what an operator would do by hand."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]
MNT = Path(os.environ.get("LAB_MOUNT", "/mnt/lab"))
ORIGIN = os.environ.get("LAB_ORIGIN_DEV", "")
RECIPE = os.environ.get("LAB_RECIPE", "")
BCACHE = Path(os.environ.get("LAB_BCACHE_SYSFS", "/nonexistent"))
DM_NAME = os.environ.get("LAB_DM_NAME", "")
OUT = Path(os.environ.get("LAB_OUT", "/tmp"))

sys.path.insert(0, str(ROOT / "tests" / "vm"))  # the guest scripts' shared helpers
from guestkit import wait  # noqa: E402,F401  (re-exported to the benchmarks)
from labdaemon import LabDaemon  # noqa: E402
from tracefs import Traced, TraceInstance, kdev  # noqa: E402


def shipped_variant(old: str, new: str) -> Path:
    """A copy of the shipped policies/default.yaml with one setting changed (a benchmark's variant of the default,
    named by what it changes); exits naming the setting when the shipped file no longer has ``old``."""
    text = (ROOT / "policies" / "default.yaml").read_text()
    if old not in text:
        raise SystemExit(f"policies/default.yaml has no {old!r} to change")
    out = Path(tempfile.mkdtemp(prefix="cp-policy-")) / "variant.yaml"
    out.write_text(text.replace(old, new, 1))
    return out


def log(msg: str) -> None:
    print(f"[guest {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _origin_stat() -> list[str]:
    st = os.stat(ORIGIN)
    return Path(f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}/stat").read_text().split()


def origin_read() -> int:
    """Bytes read from the origin device (its dm node's stat: sectors read)."""
    return int(_origin_stat()[2]) * 512


def origin_written() -> int:
    """Bytes written to the origin device (its dm node's stat: sectors written)."""
    return int(_origin_stat()[6]) * 512


def origin_io_ticks_ms() -> int:
    """Milliseconds the origin device had I/O in flight (its stat's io_ticks): the origin's busy time."""
    return int(_origin_stat()[9])



def parse_size(text: str) -> int:
    """bcache's human sizes (`1.5M`, `512k`, `0`)."""
    t = text.strip()
    units = {"k": 1 << 10, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(float(t or 0))


def dmstatus() -> list[str]:
    return subprocess.run(["dmsetup", "status", DM_NAME], capture_output=True, text=True,
                          check=True).stdout.split()


def hits_misses() -> tuple[int, int]:
    """Read hits and misses of the cache since it was built (bcache: stats_total counts reads and writes alike;
    dm-cache: read hits, read misses)."""
    if RECIPE == "bcache":
        s = BCACHE / "stats_total"
        return int((s / "cache_hits").read_text()), int((s / "cache_misses").read_text())
    f = dmstatus()
    return int(f[7]), int(f[8])


def dirty_bytes() -> int:
    if RECIPE == "bcache":
        return parse_size((BCACHE / "dirty_data").read_text())
    f = dmstatus()
    return int(f[13]) * int(f[5]) * 512  # dirty cache blocks × the block size (sectors)


def cache_in_use_pct() -> int | None:
    """bcache: the share of the cache set's buckets in use (as of its last GC). Above 40% bcache caches only
    REQ_SYNC writes, above 70% none (writeback.h, CUTOFF_WRITEBACK / CUTOFF_WRITEBACK_SYNC): the rest go straight
    to the origin. None on dm-cache."""
    if RECIPE != "bcache":
        return None
    return 100 - int((BCACHE / "cache" / "cache_available_percent").read_text())


def cache_mode() -> str:
    if RECIPE == "bcache":
        text = (BCACHE / "cache_mode").read_text()
        return text.split("[")[1].split("]")[0]
    return "dm-cache"


def set_cache_mode(mode: str) -> None:
    """writethrough / writeback: bcache through sysfs; dm-cache by reloading its table with the other feature
    (suspend writes its metadata; a dirty block written back later is still written back)."""
    if RECIPE == "bcache":
        (BCACHE / "cache_mode").write_text(mode)
        return
    table = subprocess.run(["dmsetup", "table", DM_NAME], capture_output=True, text=True, check=True).stdout.split()
    new = [mode if t in ("writeback", "writethrough", "passthrough") else t for t in table]
    env = {**os.environ, "DM_DISABLE_UDEV": "1"}
    subprocess.run(["dmsetup", "reload", DM_NAME, "--table", " ".join(new)], check=True, env=env)
    subprocess.run(["dmsetup", "suspend", DM_NAME], check=True, env=env)
    subprocess.run(["dmsetup", "resume", DM_NAME], check=True, env=env)


def settle_clean(timeout: float = 300.0) -> None:
    """Write back whatever the lab's setup left dirty (mkfs ran in write-back), so that a run starts clean: bcache
    with no throttling and no sleep between scans until its state is clean, then its settings put back (the next
    sleep after a scan is as long as they say: the stock 30 s, or what a daemon started later pins); dm-cache
    writes back on its own."""
    if RECIPE != "bcache":
        if not wait(lambda: dirty_bytes() == 0, timeout, 0.5):
            raise SystemExit(f"still {dirty_bytes()} dirty bytes after {timeout:.0f} s")
        return
    saved = {k: (BCACHE / k).read_text().strip() for k in ("writeback_percent", "writeback_delay")}
    for k in saved:
        (BCACHE / k).write_text("0")
    try:
        if not wait(lambda: dirty_bytes() == 0 and (BCACHE / "state").read_text().strip() == "clean", timeout, 0.5):
            raise SystemExit(f"still {dirty_bytes()} dirty bytes after {timeout:.0f} s")
        # the write-back thread sleeps writeback_delay once more after the scan that found it clean, with the
        # value it reads then: let it take that sleep at 0, so that no stale 30 s sleep outlives the settling
        time.sleep(1.0)
    finally:
        for k, v in saved.items():
            (BCACHE / k).write_text(v)


def timed_read_ms(path: Path, buf: mmap.mmap) -> float:
    """One O_DIRECT read of len(buf) bytes at offset 0; its latency in ms (a hit returns faster than the delayed
    origin can answer)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        t = time.perf_counter()
        os.preadv(fd, [buf], 0)
        return (time.perf_counter() - t) * 1e3
    finally:
        os.close(fd)


def read_whole(path: Path, missing_ok: bool = False) -> int:
    """Read a whole file through the page cache after dropping its cached pages, so the read reaches the cache
    device; bytes read. missing_ok: a file another thread deleted meanwhile reads as 0 bytes."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        if missing_ok:
            return 0
        raise
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        n = 0
        while chunk := os.read(fd, 1 << 20):
            n += len(chunk)
        return n
    finally:
        os.close(fd)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


class Daemon:
    """`cachepilot run` with the given policy files, as its own process (tests/vm/labdaemon.py, with the benchmarks'
    rescan and state interval); ready within 240 s or the benchmark exits; CPU and RSS sampled from /proc. It holds
    the LabDaemon rather than being one: its stop() returns the exit code to the benchmark's result instead of saying
    it to the host."""

    def __init__(self, policies: list[Path], tick: str = "1s", metrics_listen: str = "") -> None:
        """metrics_listen: the exporter's HTTP listener (IP:PORT), none by default."""
        self.lab = LabDaemon(Path(tempfile.mkdtemp(prefix="cp-bench-")), policies, tick=tick, rescan="10s",
                             state_interval="30s", metrics=metrics_listen)
        self.tmp, self.proc = self.lab.tmp, self.lab.proc
        ok = self.lab.ready(240)
        self.ready_s = time.monotonic() - self.lab.t0
        if not ok:
            raise SystemExit(f"daemon not ready after {self.ready_s:.0f} s:\n{self.log()[-2000:]}")
        log(f"daemon ready in {self.ready_s:.1f} s")
        self.cpu0 = self.cpu_s()
        self.sys0 = self.sys_s()
        self.rss_max = 0

    def cpu_s(self) -> float:
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def sys_s(self) -> float:
        """Of cpu_s, the kernel's share (syscalls: FITRIM, ring reads, promotion reads, sysfs)."""
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(f[12]) / os.sysconf("SC_CLK_TCK")

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def sample(self) -> None:
        self.rss_max = max(self.rss_max, self.rss())

    def explain(self) -> list[dict]:
        return list(self.ask("explain")["decisions"])

    def ask(self, cmd: str) -> dict:
        """One request on the daemon's control socket (status / top / explain)."""
        from cachepilot.daemon.control import request

        return request(self.tmp / "ctl.sock", {"cmd": cmd})

    def log(self) -> str:
        return self.lab.log()

    def stop(self, keep_log: str = "") -> int:
        """Stop the daemon; with keep_log, its whole log goes to $LAB_OUT/<keep_log>-daemon.log."""
        rc = self.lab.terminate(120)
        if keep_log:
            (OUT / f"{keep_log}-daemon.log").write_text(self.log())
        return rc


class DiscardWitness(Traced):
    """Delete -> discard latency, witnessed by the kernel rather than by the daemon: ftrace records every discard
    bio queued on the cached volume (block_bio_queue in a private instance, trace clock CLOCK_MONOTONIC, so its
    timestamps compare with time.monotonic()); a deleted file counts as discarded when the first discard that
    overlaps the extents FIEMAP gave for it just before the unlink arrives."""

    def __init__(self, device: str) -> None:
        self.trace = TraceInstance(f"cp-bench-{os.getpid()}", {"block/block_bio_queue": f"dev == {kdev(device)}"},
                                   clock="mono", buffer_kb=8192).open()
        self.deletes: list[tuple[float, list[tuple[int, int]]]] = []
        self._seen: list[tuple[float, int, int]] | None = None

    def deleting(self, path: Path) -> None:
        """Call just before unlinking path: its extents, in 512-byte sectors of the volume."""
        from cachepilot.actuators.extents import fiemap

        fd = os.open(path, os.O_RDONLY)
        try:
            # no FIEMAP_FLAG_SYNC: it would write the file's unwritten appends first and change the workload;
            # data never written has no blocks to discard anyway
            ext = [(e.physical // 512, e.length // 512) for e in fiemap(fd) if e.on_disk]
        finally:
            os.close(fd)
        self.deletes.append((time.monotonic(), ext))

    def discards(self) -> list[tuple[float, int, int]]:
        """Every discard bio seen (time, sector, sectors); the first call ends the recording, later calls repeat
        its answer."""
        if self._seen is not None:
            return self._seen
        self.trace.disable()
        out = []
        for line in self.trace.lines():
            if line.startswith("#") or "block_bio_queue:" not in line:
                continue
            head, rest = line.split(": block_bio_queue:", 1)
            f = rest.split()  # "252,0 DS 2048 + 256 [fstrim]"
            if len(f) >= 5 and "D" in f[1] and f[3] == "+":
                out.append((float(head.split()[-1]), int(f[2]), int(f[4])))
        self.trace.close()
        self._seen = out
        return out

    def latencies(self) -> tuple[list[float], int]:
        """(seconds from each delete to the first discard overlapping its extents, deletes never discarded)."""
        disc = sorted(self.discards())
        lat, never = [], 0
        for t, ext in self.deletes:
            hit = next((d for d, s, n in disc if d >= t and any(s < a + m and a < s + n for a, m in ext)), None)
            if hit is None:
                never += 1
            else:
                lat.append(hit - t)
        return lat, never


class WorkloadHits(Traced):
    """The workload's own read hits and misses on bcache, without the daemon's promotion reads: ftrace records the
    read bios one process (the workload) queues on the cached device (block_bio_queue, filtered by pid) and every
    bcache_read event (hit / bypass per request; logged from bcache's completion context, so it carries no useful
    pid, but its sector is the request's sector on the backing device, shifted by the backing superblock's data
    offset); a bcache_read counts for the workload when its sector, shifted back, is one of the workload's reads."""

    BYPASS = ("bcache_bypass_sequential", "bcache_bypass_congested")

    def __init__(self, device: str, pid: int) -> None:
        events = {"block/block_bio_queue": f"dev == {kdev(device)} && common_pid == {pid}", "bcache/bcache_read": ""}
        # why reads and writes skip the cache, counted for the workload's own requests
        events.update({f"bcache/{ev}": f"common_pid == {pid}" for ev in self.BYPASS})
        self.trace = TraceInstance(f"cp-hits-{os.getpid()}", events, buffer_kb=8192).open()

    def counts(self) -> dict:
        """hits, misses, bypassed of the workload's reads (the offset that matches most requests wins: 16 sectors
        for make-bcache's default data offset)."""
        self.trace.disable()
        mine: set[int] = set()
        reads: list[tuple[int, bool, bool]] = []
        lines = self.trace.lines()
        why = {ev: sum(1 for ln in lines if f": {ev}:" in ln) for ev in self.BYPASS}
        for line in lines:
            if ": block_bio_queue:" in line:
                f = line.split(": block_bio_queue:", 1)[1].split()
                if len(f) >= 3 and "R" in f[1]:
                    mine.add(int(f[2]))
            elif ": bcache_read:" in line:
                f = line.split(": bcache_read:", 1)[1].split()  # "254,0 RA 2064 + 256 hit 1 bypass 0"
                if len(f) >= 9 and f[5] == "hit" and f[7] == "bypass":
                    reads.append((int(f[2]), f[6] == "1", f[8] == "1"))
        self.trace.close()
        off = max((0, 16), key=lambda o: sum(1 for s, _, _ in reads if s - o in mine))
        own = [(h, b) for s, h, b in reads if s - off in mine]
        hits = sum(1 for h, _ in own if h)
        return {"hits": hits, "misses": len(own) - hits, "bypassed": sum(1 for _, b in own if b),
                "workload_read_bios": len(mine), "matched": len(own), "offset": off,
                **{ev.replace("bcache_", "workload_"): n for ev, n in why.items()}}


class DirtyTrace(Traced):
    """bcache's own record of what it cached dirty (bcache_write with writeback 1) and wrote back (bcache_writeback,
    one event per key), in backing-device sectors, on the monotonic clock: the input of the exposure witness
    (lifetimes.oldest_dirty_age)."""

    def __init__(self) -> None:
        events = {"bcache/bcache_write": "", "bcache/bcache_writeback": ""}
        self.trace = TraceInstance(f"cp-dirty-{os.getpid()}", events, clock="mono", buffer_kb=16384).open()

    def events(self) -> tuple[list[tuple[float, str, int, int]], bool]:
        """(events, whether the trace buffer overran: then the witness is incomplete)."""
        self.trace.disable()
        overrun = self.trace.overran()
        out: list[tuple[float, str, int, int]] = []
        lines = self.trace.lines()
        # a few raw lines go into the result: the parser below assumes the 6.1 formats
        self.samples = ([ln for ln in lines if ": bcache_write:" in ln][:2]
                        + [ln for ln in lines if ": bcache_writeback:" in ln][:2])
        for line in lines:
            if ": bcache_write:" in line:  # "<uuid> inode 0  W 2064 + 8 hit 1 bypass 0"
                head, rest = line.split(": bcache_write:", 1)
                f = rest.split()
                if len(f) >= 9 and f[-4] == "hit":
                    # cached dirty ("hit" is the writeback flag); any other write replaced the range on the origin
                    kind = "w" if f[-3] == "1" and f[-1] == "0" else "c"
                    out.append((float(head.split()[-1]), kind, int(f[-7]), int(f[-5])))
            elif ": bcache_writeback:" in line:  # "1:4128 len 64 dirty 1" (the key's end sector)
                head, rest = line.split(": bcache_writeback:", 1)
                f = rest.split()
                end, size = int(f[0].split(":")[1]), int(f[2])
                out.append((float(head.split()[-1]), "wb", end - size, size))
        self.trace.close()
        return out, overrun


class BioTrace(Traced):
    """The exposure witness's input on a dm target without tracepoints of its own (dm-writecache): the block
    layer's bios (block:block_bio_queue) on the cached volume and on its origin, on the monotonic clock, as the
    events lifetimes.oldest_dirty_age reads: a write to the volume ("w": its blocks' age starts; dm-writecache
    caches every write), a write to the origin at the same sectors ("wb": write-back, or a write sent around the
    cache -- either way those blocks are clean), a discard of the volume ("d": dead). ``volume`` and ``origin``
    are "major:minor"."""

    FIELDS = 5  # "253,2 W 2064 + 8 [comm]": dev, rwbs, sector, "+", sectors

    def __init__(self, volume: str, origin: str) -> None:
        self.devs = {self._kdev(volume): "volume", self._kdev(origin): "origin"}
        self.trace = TraceInstance(f"cp-bio-{os.getpid()}",
                                   {"block/block_bio_queue": " || ".join(f"dev == {d}" for d in self.devs)},
                                   clock="mono", buffer_kb=16384).open()
        self.names = {f"{d >> 20},{d & ((1 << 20) - 1)}": role for d, role in self.devs.items()}

    @staticmethod
    def _kdev(majmin: str) -> int:
        major, minor = (int(x) for x in majmin.split(":"))
        return (major << 20) | minor  # the kernel's dev_t (MKDEV), as the tracepoint's filter compares it

    def events(self) -> tuple[list[tuple[float, str, int, int]], bool]:
        """(events, whether the trace buffer overran: then the witness is incomplete)."""
        self.trace.disable()
        overrun = self.trace.overran()
        out = bio_events(self.trace.lines(), self.names)
        self.trace.close()
        return out, overrun


def bio_events(lines: list[str], names: dict[str, str]) -> list[tuple[float, str, int, int]]:
    """block_bio_queue lines ("... 1234.5678: block_bio_queue: 253,2 W 2064 + 8 [comm]") as witness events;
    ``names``: "major,minor" -> "volume" | "origin"."""
    out: list[tuple[float, str, int, int]] = []
    for line in lines:
        head, sep, rest = line.partition(": block_bio_queue:")
        f = rest.split()
        if not sep or len(f) < BioTrace.FIELDS or f[3] != "+" or int(f[4]) == 0:
            continue  # an empty flush bio carries no data
        role, rwbs, t = names.get(f[0]), f[1], float(head.split()[-1])
        if role == "volume" and "D" in rwbs:
            out.append((t, "d", int(f[2]), int(f[4])))
        elif "W" in rwbs and role is not None:
            out.append((t, "w" if role == "volume" else "wb", int(f[2]), int(f[4])))
    return out


class DirtyAge:
    """The exposure witness from outside the daemon: the largest dirty amount seen and an upper bound on the age of
    the oldest dirty data (seconds since the cache was last seen with nothing dirty: no dirty byte can be older)."""

    def __init__(self) -> None:
        self.t_clean = time.monotonic()
        self.max_bytes = 0
        self.max_age_s = 0.0

    def restart(self) -> None:
        """A new phase: maxima from now on (the time since clean goes on: data dirty before it is no younger)."""
        self.max_bytes, self.max_age_s = 0, time.monotonic() - self.t_clean

    def see(self, dirty: int) -> None:
        now = time.monotonic()
        if dirty == 0:
            self.t_clean = now
        self.max_bytes = max(self.max_bytes, dirty)
        self.max_age_s = max(self.max_age_s, now - self.t_clean)


class CpuTax:
    """A busy loop that takes `pct` % of one CPU, as its own process: the CPU-tax control that stands in for the
    daemon's CPU without its policy. It spins whenever its own CPU time is behind pct × the wall time since it
    started (a duty cycle by wall time would get less than its share on a saturated vCPU, where the daemon's share
    was measured)."""

    def __init__(self, pct: float) -> None:
        share = max(0.0, min(1.0, pct / 100))
        code = ("import time\nt0, c0 = time.monotonic(), time.process_time()\nwhile True:\n"
                f" if time.process_time() - c0 < {share!r} * (time.monotonic() - t0):\n"
                "  e = time.monotonic() + 0.005\n  while time.monotonic() < e: pass\n"
                " else:\n  time.sleep(0.01)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code])

    def cpu_s(self) -> float:
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_window(threads: list[threading.Thread], t0: float, warmup: float, daemon: Daemon | None
               ) -> tuple[float, float, float]:
    """A workload's threads, which measure from ``t0`` (now + ``warmup``) to their end: started, the warm-up slept,
    joined. Returns the seconds from t0 to their end, the origin's MiB written over the window, and the daemon's CPU
    seconds at the window's start (0 without one)."""
    for t in threads:
        t.start()
    time.sleep(warmup)
    w0, cpu0 = origin_written(), daemon.cpu_s() if daemon else 0.0
    for t in threads:
        t.join()
    return time.monotonic() - t0, (origin_written() - w0) / MIB, cpu0


class Sampler(threading.Thread):
    """Every `period` seconds: a dict from `fn()` with the time since start, appended to `rows`."""

    def __init__(self, fn: Callable[[], dict], period: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.fn, self.period, self.rows = fn, period, []  # type: ignore[var-annotated]
        self.t0 = time.monotonic()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            row = self.fn()
            row["t"] = round(time.monotonic() - self.t0, 2)
            self.rows.append(row)
            self.stopped.wait(self.period)

    def stop(self) -> list[dict]:
        self.stopped.set()
        self.join()
        return self.rows


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def write_result(name: str, data: dict) -> None:
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1))
    log(f"wrote {OUT / (name + '.json')}")
