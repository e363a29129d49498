"""Lab: the lifetime hold on real bcache (write-back, a 64 MiB cache, ext4 mounted -o discard so that both runs
kill deleted data the same way). The same young file twice -- 12 MiB written (fsync), deleted 20 s later -- first
on stock settings (writeback_percent 10), then under `cachepilot run` with the recoverable model, after a workload
that taught it the volume's delete ages (a 1 MiB file every second, each deleted 10 s after it was written), once
its lifetime hold has raised writeback_percent. For each: origin bytes written during the file's life, and how much
of it was still dirty when the delete discarded it. Then SIGTERM: the daemon puts writeback_percent back.
key=value lines on stdout."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cachepilot.backends.inspect import block_name, parse_bcache_size
from cachepilot.daemon.control import request

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say, wait  # noqa: E402

MIB = 1 << 20
AGE_S = 10  # each file dies this long after it was written (10 MiB young data live: fits the 30% room)
YOUNG, LIFE_S = 12 * MIB, 20  # the measured file: 12 MiB (stock's 10% target of the 64 MiB cache is 6.4 MiB)
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
origin = os.environ["LAB_ORIGIN_DEV"]
cli = str(Path(sys.executable).with_name("cachepilot"))
tmp = Path(tempfile.mkdtemp(prefix="cp-lifetime-"))
POLICY = """version: 1
defaults:
  failure_model: recoverable
  promotion: {enabled: false}
  lifetime_hold: {enabled: true}   # the shipped defaults: share 0.9, max_hold 10m, headroom 0.1
  # lab setup, the same as the stock run's: no sequential bypass (1 MiB files), no congestion bypass (TCG)
  knobs: {sequential_cutoff: 0, congested_read_threshold_us: 0, congested_write_threshold_us: 0}
"""


def attr(name: str) -> str:
    return (sysfs / name).read_text().strip()


def put(name: str, value: str) -> None:
    (sysfs / name).write_text(value)


def dirty() -> int:
    return parse_bcache_size(attr("dirty_data"))


def origin_written() -> int:
    return int(Path(f"/sys/block/{block_name(origin)[0]}/stat").read_text().split()[6]) * 512


class Workload(threading.Thread):
    """A 1 MiB file every second, each deleted AGE_S after it was written (by another process than the daemon's:
    the probe ignores the daemon's own pid, not ours)."""

    def __init__(self, d: Path) -> None:
        super().__init__(daemon=True)
        self.d = d
        self.stop = threading.Event()
        self.written = self.deleted = 0

    def run(self) -> None:
        self.d.mkdir()
        i = 0
        while not self.stop.is_set():
            t = time.monotonic()
            with open(self.d / f"f{i}", "wb") as f:
                f.write(os.urandom(MIB))
                f.flush()
                os.fsync(f.fileno())
            self.written += MIB
            if i >= AGE_S:
                os.unlink(self.d / f"f{i - AGE_S}")
                self.deleted += MIB
            i += 1
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))


def young_file(tag: str) -> None:
    """One file of YOUNG bytes written (fsync), deleted LIFE_S later (-o discard: the delete discards it). Origin
    bytes written during its life, and how much of it was still dirty when its delete discarded it. A small read
    every 0.2 s keeps the cache set busy: an idle one writes back at full speed whatever the target."""
    os.sync()
    time.sleep(2)
    busy = threading.Event()

    def keep_busy() -> None:
        while not busy.wait(0.2):
            fd = os.open(mnt / "busy", os.O_RDONLY | os.O_DIRECT)
            os.preadv(fd, [buf], 0)
            os.close(fd)

    threading.Thread(target=keep_busy, daemon=True).start()
    in_use = [100 - int(attr("cache/cache_available_percent"))]
    o0, d0 = origin_written(), dirty()
    with open(mnt / f"young-{tag}", "wb") as f:
        f.write(os.urandom(YOUNG))
        f.flush()
        os.fsync(f.fileno())
    d1 = dirty()
    t_end = time.monotonic() + LIFE_S
    while time.monotonic() < t_end:
        in_use.append(100 - int(attr("cache/cache_available_percent")))
        time.sleep(1)
    say(f"{tag}_young_origin_written", origin_written() - o0)
    say(f"{tag}_young_dirty_added", d1 - d0)
    d2 = dirty()
    os.unlink(mnt / f"young-{tag}")
    os.sync()  # the commit: ext4 -o discard sends the discard
    wait(lambda: dirty() <= d2 - YOUNG // 2, 10, 0.2)
    time.sleep(1)
    say(f"{tag}_young_dirty_discarded", d2 - dirty())
    say(f"{tag}_in_use_max", max(in_use))
    say(f"{tag}_writeback_percent", attr("writeback_percent"))
    say(f"{tag}_rate_debug", " ".join(attr("writeback_rate_debug").split()))
    busy.set()


def clean() -> None:
    """Between the runs: everything written back, stock settings again."""
    put("writeback_percent", "0")
    put("writeback_delay", "0")
    ok = wait(lambda: dirty() == 0, 120, 0.5)
    put("writeback_percent", "10")
    put("writeback_delay", "30")
    say("cleaned", "yes" if ok else f"no:{dirty()}")


subprocess.run(["mount", "-o", "remount,discard", str(mnt)], check=True)
for k in ("sequential_cutoff", "cache/congested_read_threshold_us", "cache/congested_write_threshold_us"):
    put(k, "0")
say("stock_percent", attr("writeback_percent"))
clean()

buf = mmap.mmap(-1, 4096)
(mnt / "busy").write_bytes(os.urandom(4096))
# 1. stock: writeback_percent 10
young_file("stock")
clean()

# 2. the daemon, recoverable, the lifetime hold on
(tmp / "policy.yaml").write_text(POLICY)
(tmp / "c.yaml").write_text("version: 1\npolicies: [policy.yaml]\nstate_dir: state\nsocket: ctl.sock\ntick: 1s\n"
                            "rescan: 5s\nstate_interval: 5s\nmetrics: {listen: ''}\n")
err = open(tmp / "stderr", "w+")
d = subprocess.Popen([cli, "run", "--config", str(tmp / "c.yaml")], stderr=err, stdout=subprocess.DEVNULL)
ok = wait(lambda: (tmp / "ctl.sock").exists() and "ready" in (tmp / "stderr").read_text(), 150)
say("ready", "yes" if ok else "no")
if not ok:
    err.seek(0)
    print(err.read())
    sys.exit(1)
w = Workload(mnt / "held")
w.start()
t0 = time.monotonic()
held = wait(lambda: int(attr("writeback_percent")) >= 25, 120, 1)
say("hold_reached_s", f"{time.monotonic() - t0:.0f}" if held else "never")
w.stop.set()
w.join()
for f in (mnt / "held").iterdir():
    f.unlink()  # the workload's last files
time.sleep(10)  # write-back's PI controller unwinds what it integrated while the hold ramped up
young_file("hold")
decisions = request(tmp / "ctl.sock", {"cmd": "explain"})["decisions"]
holds = [x for x in decisions if x["kind"] == "set_knob" and "lifetime hold" in x.get("reason", "")]
say("hold_decisions", len(holds))
say("hold_done", sum(1 for x in holds if x["status"] == "done"))
if holds:
    say("hold_last_reason", holds[-1]["reason"].replace("\n", " "))
    say("hold_last_readback", holds[-1]["writes"][-1]["readback"] if holds[-1]["writes"] else "")
d.send_signal(signal.SIGTERM)
say("exit", d.wait(timeout=60))
say("percent_after_exit", attr("writeback_percent"))
err.seek(0)
log = err.read()
say("traceback", "yes" if "Traceback" in log else "no")
say("log_put_back", "yes" if "put back on exit" in log else "no")
