"""Lab: hot large files on bcache with the stock `sequential_cutoff` (4 MiB), `cachepilot run` with the probe.

A 16 MiB file H read whole three times and a 16 MiB file C read once, the page cache dropped before every read
(as on a host whose page cache cannot hold them). bcache sends each whole read around itself as a sequential run
past the cutoff (check_should_bypass), so stock bcache never caches either, however often it is read. The
daemon's large-file class (promotion.large_files; argument `off`: without it) admits H after its second whole read
and promotes it by reading its extents in descending 64-256 KiB chunks (no bio continues a recent run: nothing
accumulates in bcache's sequential detector); C, read once, never qualifies. The daemon is started by this script
after it wrote 544 MiB, so every thread of it inherits a large bcache run average (copy_process resets it only when
bcache is built in): the reader sheds it first (actuators/taskruns.py); `dd`, started the same way, is bypassed from
its first read. bcache's own account of the promotion (its tracepoints, tests/vm/bcache_trace.py) is printed.
Then a cold stream of twice the cache is read once (a backup) and H is read again. key=value lines on stdout:
origin bytes per read, bcache's read counters per phase."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cachepilot.backends.inspect import block_name, describe_volume
from cachepilot.daemon.control import request

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from bcache_trace import Trace, devno, explain_bypasses, timeline  # noqa: E402
from guestkit import say, wait  # noqa: E402
from labdaemon import LabDaemon  # noqa: E402

MIB = 1 << 20
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
origin = os.environ["LAB_ORIGIN_DEV"]
tmp = Path(tempfile.mkdtemp(prefix="cp-hotlarge-"))
LARGE = sys.argv[1:] != ["off"]  # "off": the same daemon without the large-file class
POLICY = f"""version: 1
defaults:
  failure_model: recoverable
  promotion: {{enabled: true, rate: 4MiB, max_cache_fraction: 0.25, sieve_size: 1MiB,
              large_files: {{enabled: {"true" if LARGE else "false"}, min_reads: 2, max_size: 64MiB}}}}
  sequential_steering: {{enabled: false}}   # the stock cutoff stays 4 MiB throughout
  # under TCG, with other guests on the cores, the cache device looks congested and bcache bypasses everything
  knobs: {{congested_read_threshold_us: 0, congested_write_threshold_us: 0}}
"""
# the control (off) waits for a promotion as long as the test allows the class (on) to take from the second read's
# end (tests/vm/test_hotlarge_lab.py: hot_promoted_after_read2_s <= 15) -- and counts promotions again at the end
PROMOTED_WITHIN_S = 15
ENDED: dict[str, float] = {}  # each phase's read: the wall clock when it ended (the decisions' "ts" is wall time)
STATS = ("cache_hits", "cache_misses", "cache_bypass_hits", "cache_bypass_misses", "cache_miss_collisions")


def origin_read() -> int:
    return int(Path(f"/sys/block/{block_name(origin)[0]}/stat").read_text().split()[2]) * 512


def counts() -> list[int]:
    return [int((sysfs / "stats_total" / k).read_text()) for k in STATS]


def write(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
        os.fsync(f.fileno())


def read_whole(path: Path) -> int:
    """An application's whole read (buffered, 1 MiB, readahead) after the page cache is dropped: origin bytes."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    before = origin_read()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M", "status=none"], check=True)
    return origin_read() - before


def promotions(ino: int) -> list[dict[str, object]]:
    return [x for x in request(tmp / "ctl.sock", {"cmd": "explain"})["decisions"]
            if x["kind"] == "promote" and f" ino={ino} " in str(x["action"])]


def reattach() -> None:
    """Detach and attach the backing device again: the same cache set, empty for this volume (what the writes of the
    set-up left cached -- the first 4 MiB of each file, before the write run passed the cutoff -- is gone)."""
    cset = os.path.basename(os.readlink(sysfs / "cache"))
    (sysfs / "detach").write_text("1\n")
    wait(lambda: not (sysfs / "cache").exists(), 30)
    (sysfs / "attach").write_text(cset + "\n")
    wait(lambda: (sysfs / "cache").exists(), 30)


def phase(name: str, path: Path, counted: bool = LARGE) -> None:
    """One whole read of ``path``; with ``counted``, bcache's read counters over it. They fold every ~14 s
    (accounting_delay in stats.c): the phase ends at the first fold after the read (or 16 s, if a fold during the
    read took it all), so that the next phase's counters are its own. Uncounted, only the origin bytes are said: the
    control (off) asserts no counter, nor does anything after read3 and cold_again (read3's late fold lands in the
    stream's hits, which its check does not weigh); each fold waited for costs ~10 s of the suite."""
    c0 = counts()
    say(f"{name}_origin_bytes", read_whole(path))
    ENDED[name] = time.time()
    if not counted:
        return
    c1 = counts()
    wait(lambda: counts() != c1, 16)
    for k, a, b in zip(STATS, c0, counts(), strict=True):
        say(f"{name}_{k}", b - a)


cache_bytes = describe_volume(os.environ["LAB_CACHED_DEV"]).cache_bytes
say("cache_bytes", cache_bytes)
hot, cold, stream = mnt / "hot", mnt / "cold", mnt / "stream"
write(hot, 16 * MIB)
write(cold, 16 * MIB)
write(stream, 2 * cache_bytes)
reattach()
say("sequential_cutoff", (sysfs / "sequential_cutoff").read_text().strip())

d = LabDaemon(tmp, POLICY, tick="500ms", rescan="2s", state_interval="2s")
ok = d.ready(150)
say("ready", "yes" if ok else "no")
if not ok:
    d.fail()
knobs_off = lambda: all((sysfs / "cache" / f"congested_{rw}_threshold_us").read_text().strip() == "0"  # noqa: E731
                        for rw in ("read", "write"))
say("knobs_set", "yes" if wait(knobs_off, 30) else "no")

phase("read1", hot)
phase("cold_read", cold)
trace = Trace()  # bcache's own account from the admitting read to the promotion's end (bcache_trace.py)
trace.start()
phase("read2", hot)
ino_hot, ino_cold = os.stat(hot).st_ino, os.stat(cold).st_ino
done = lambda: any(x["status"] == "done" for x in promotions(ino_hot))  # noqa: E731
t0 = time.monotonic()
say("hot_promoted", "yes" if wait(done, 90 if LARGE else PROMOTED_WITHIN_S) else "no")
say("hot_promoted_s", f"{time.monotonic() - t0:.1f}")
# from the end of the second whole read to the promotion's done (the daemon's own record of it): the admission (the
# probe's tick, the engine's bucket) and the paced read of 16 MiB at the rate
first_done = min((float(x["ts"]) for x in promotions(ino_hot) if x["status"] == "done"), default=None)
say("hot_promoted_after_read2_s", "none" if first_done is None else f"{first_done - ENDED['read2']:.1f}")
for x in promotions(ino_hot):
    print("promote:", x["status"], x["reason"], x["detail"])
# the promoter's bios (the daemon's threads: comm "cachepilot") that bcache bypassed as sequential, and which run each
# continued (a bio that ended where it started, within the 5 s run memory): the cause of a promotion left uncached
recs = trace.stop()
bdev = devno(block_name(os.environ["LAB_CACHED_DEV"])[0])
why = explain_bypasses(recs, bdev, "cachepilot")
for line in timeline(recs, bdev, int(str(why["offset"])), 120):
    print("bio:", line)
print("hot extents:", subprocess.run(["filefrag", "-v", "-b512", str(hot)], capture_output=True, text=True).stdout)
for k in ("bios", "bypassed", "bypassed_bytes", "alloc_fail"):
    say(f"promoter_{k}", why[k])
print("bypassed (start+sectors@ts<-the run it continued):", why["continuing"], why["examples"],
      "by comm:", why["bypassed_by_comm"], "offset:", why["offset"])
vol = request(tmp / "ctl.sock", {"cmd": "status"})["volumes"][0].get("metrics") or {}
# bcache's refused read-miss inserts so far and the promoter's rate now (it halves on them: allocpace)
say("alloc_failures_after_promotion", vol.get("alloc_failures"))
say("promotion_rate_after_promotion", vol.get("promotion_rate"))
phase("read3", hot, counted=False)
phase("stream", stream)  # the backup: twice the cache, read once
phase("read4", hot)
hot_decisions = promotions(ino_hot)
REREAD = "re-read once"  # allocpace: what was read while bcache refused inserts, read once more
say("hot_promotions_done", sum(1 for x in hot_decisions if x["status"] == "done" and REREAD not in str(x["reason"])))
say("hot_rereads_done", sum(1 for x in hot_decisions if x["status"] == "done" and REREAD in str(x["reason"])))
for x in hot_decisions:
    print("promote (all):", x["status"], str(x["reason"])[:60], x["detail"])
say("hot_large_reason", "yes" if any("large file (16.0 MiB) read whole" in str(x["reason"])
                                     for x in hot_decisions) else "no")
say("cold_promotions", len(promotions(ino_cold)))
say("stream_promotions", len(promotions(os.stat(stream).st_ino)))
status = request(tmp / "ctl.sock", {"cmd": "status"})["volumes"][0]
say("promotions_skipped", status.get("promotions_skipped"))
for line in d.stop(timeout=60).splitlines():  # what the daemon said about bcache's hook and its refusals
    if "alloc" in line or "hook" in line or "re-read" in line:
        print("daemon:", line[:200])
# the daemon gone: a second read of C cannot be promoted, and shows C was not cached
phase("cold_again", cold, counted=False)
