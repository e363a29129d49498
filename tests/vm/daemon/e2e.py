"""Lab: `cachepilot run` on the lab's bcache (writeback) volume under a small workload. Deleted files' dirty data
becomes discards (FITRIM through the daemon) and leaves the cache; status, top and explain answer; SIGHUP with a
broken policy keeps the running one; SIGTERM exits 0 and leaves the cache as it was. key=value lines on stdout."""

from __future__ import annotations

import contextlib
import io
import json
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say, wait  # noqa: E402

MIB = 1 << 20
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
origin = os.environ["LAB_ORIGIN_DEV"]
cli = str(Path(sys.executable).with_name("cachepilot"))  # the daemon itself runs as its own process
tmp = Path(tempfile.mkdtemp(prefix="cp-daemon-"))
POLICY = """version: 1
defaults:
  failure_model: recoverable
  promotion: {enabled: true, rate: 4MiB, sieve_size: 1MiB}
  discard_on_delete: {enabled: true, min_extent: 4KiB}  # the shipped timing: right after the commit
  # keep written data dirty (set by the daemon): no sequential bypass, and no congestion bypass (under TCG, with
  # other guests on the cores, the cache device looks congested and bcache sends writes straight to the origin)
  knobs: {writeback_percent: 40, sequential_cutoff: 0, congested_read_threshold_us: 0,
          congested_write_threshold_us: 0}
"""



def dirty() -> int:
    return parse_bcache_size((sysfs / "dirty_data").read_text())


def origin_written() -> int:
    return int(Path(f"/sys/block/{block_name(origin)[0]}/stat").read_text().split()[6]) * 512


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI's own code (cachepilot.cli.main) in this process: a new python per call costs tens of seconds in a
    busy TCG guest (imports over 9p)."""
    from cachepilot.cli import main

    out, errs = io.StringIO(), io.StringIO()
    os.environ["COLUMNS"] = "300"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errs):
        rc = main([*args, "--socket", str(tmp / "ctl.sock")])
    return subprocess.CompletedProcess(args, rc, out.getvalue(), errs.getvalue())



(tmp / "policy.yaml").write_text(POLICY)
(tmp / "c.yaml").write_text("version: 1\npolicies: [policy.yaml]\nstate_dir: state\nsocket: ctl.sock\ntick: 500ms\n"
                            "rescan: 2s\nstate_interval: 2s\nmetrics: {listen: ''}\n")
say("mode_before", (sysfs / "cache_mode").read_text().strip())
say("wb_percent_before", (sysfs / "writeback_percent").read_text().strip())  # before the daemon pins it
err = open(tmp / "stderr", "w+")
t0 = time.monotonic()
d = subprocess.Popen([cli, "run", "--config", str(tmp / "c.yaml")], stderr=err, stdout=subprocess.DEVNULL)
ok = wait(lambda: (tmp / "ctl.sock").exists() and "ready" in (tmp / "stderr").read_text(), 150)
say("ready", "yes" if ok else "no")
say("ready_s", f"{time.monotonic() - t0:.1f}")
if not ok:
    err.seek(0)
    print(err.read())
    sys.exit(1)
def pinned() -> bool:  # the knobs the policy pins, as the kernel reads them back (else big writes bypass)
    return ((sysfs / "writeback_percent").read_text().strip() == "40"
            and parse_bcache_size((sysfs / "sequential_cutoff").read_text()) == 0
            and all((sysfs / "cache" / f"congested_{rw}_threshold_us").read_text().strip() == "0"
                    for rw in ("read", "write")))


knobs = wait(pinned, 30)
say("knob_set", "yes" if knobs else "no")

# keep what is written dirty however slow this guest is (an idle bcache writes back at full speed): only the
# daemon's discards may take it out of the cache
(sysfs / "writeback_running").write_text("0")
os.sync()
time.sleep(0.5)
base = dirty()  # what was dirty before the workload (the recipe's mkfs and journal, not yet written back)
say("dirty_base", base)
# the workload: 16 MiB of new files (dirty in the write-back cache), a small hot file read again and again
work = mnt / "work"
work.mkdir()
for i in range(4):
    with open(work / f"dead{i}", "wb") as f:
        f.write(os.urandom(4 * MIB))
        f.flush()
        os.fsync(f.fileno())
with open(work / "hot", "wb") as f:
    f.write(os.urandom(256 * 1024))
    os.fsync(f.fileno())
buf = mmap.mmap(-1, 256 * 1024)
for _ in range(10):
    fd = os.open(work / "hot", os.O_RDONLY | os.O_DIRECT)
    os.readv(fd, [buf])
    os.close(fd)
os.sync()
time.sleep(1)
d0, w0 = dirty(), origin_written()
say("dirty_before", d0)
for i in range(4):
    os.unlink(work / f"dead{i}")
os.sync()
t_del = time.monotonic()
wait(lambda: dirty() <= base + 512 * 1024, 30)
say("discard_s", f"{time.monotonic() - t_del:.1f}")
time.sleep(1)
say("dirty_after", dirty())
say("origin_written_during", origin_written() - w0)

s = request(tmp / "ctl.sock", {"cmd": "status"})
(vol,) = s["volumes"]
say("status_kind", vol["kind"])
say("status_mode", vol["mode"])
say("observe_only", s["observe_only"])
# the hot file was read with nothing bypassed (sequential_cutoff 0, congestion off): bcache keeps it by itself, so
# it is not promoted (once bcache's stats fold, ~14 s, shows no bypass within 30 s of its admission)
skipped = lambda: request(tmp / "ctl.sock", {"cmd": "status"})["volumes"][0]["promotions_skipped"]  # noqa: E731
ok = wait(lambda: any(k.startswith("inserted by the cache itself") for k in skipped()), 60)
say("hot_skipped_as_inserted", "yes" if ok else "no:" + json.dumps(skipped()))
stats = sysfs / "stats_total"
counts = lambda: [int((stats / k).read_text()) for k in  # noqa: E731
                  ("cache_hits", "cache_misses", "cache_bypass_hits", "cache_bypass_misses")]
c0 = counts()
for _ in range(4):
    fd = os.open(work / "hot", os.O_RDONLY | os.O_DIRECT)
    os.readv(fd, [buf])
    os.close(fd)
wait(lambda: counts()[0] > c0[0] or counts()[1] > c0[1], 30)
c1 = counts()
say("hot_reread", " ".join(f"{k}={b - a}" for k, a, b in zip(("hits", "misses", "bypass_hits", "bypass_misses"),
                                                              c0, c1, strict=True)))
explain = request(tmp / "ctl.sock", {"cmd": "explain"})["decisions"]
say("promote_done", sum(1 for x in explain if x["kind"] == "promote" and x["status"] == "done"))
say("knob_decisions_done", sum(1 for x in explain if x["kind"] == "set_knob" and x["status"] == "done"))
discards = [x for x in explain if x["kind"] == "discard"]
say("discard_decisions", len(discards))
say("discard_done", sum(1 for x in discards if x["status"] == "done"))
say("discard_issued_bytes", sum(int(x["detail"].split("range(s), ")[1].split(" bytes")[0]) for x in discards
                                if "FITRIM issued" in x["detail"]))
r = run_cli("status")
say("cli_status_rc", r.returncode)
say("cli_status_has_volume", "yes" if vol["name"] in r.stdout and "writeback" in r.stdout else "no")
r = run_cli("top", "--once")
say("cli_top_rc", r.returncode)
say("cli_top_has_hot", "yes" if str(work / "hot") in r.stdout else "no:" + r.stdout[-400:].replace("\n", "|"))
r = run_cli("explain", "--since", "10m")
say("cli_explain_rc", r.returncode)
say("cli_explain_has_fitrim", "yes" if "FITRIM issued" in r.stdout and "freed by deletes" in r.stdout else "no")

# SIGHUP with a broken policy: the running one stays
(tmp / "policy.yaml").write_text("version: 1\ndefaults:\n  exposure: {max_dirty: plenty}\n")
d.send_signal(signal.SIGHUP)
wait(lambda: request(tmp / "ctl.sock", {"cmd": "status"})["policy"]["last_error"] is not None, 10)
p = request(tmp / "ctl.sock", {"cmd": "status"})["policy"]
say("reload_error", json.dumps(p["last_error"]))
say("policy_generation", p["generation"])
say("alive_after_hup", "yes" if d.poll() is None else "no")

# the volume vanishes (unmounted, bcache device stopped) and comes back (backing device registered, mounted)
logged = lambda text: text in (tmp / "stderr").read_text()  # noqa: E731
subprocess.run(["umount", str(mnt)], check=True)
(sysfs / "stop").write_text("1")
say("dropped", "yes" if wait(lambda: logged("dropped bcache0: "), 30) else "no")
say("gone_from_status", "yes" if not request(tmp / "ctl.sock", {"cmd": "status"})["volumes"] else "no")
Path("/sys/fs/bcache/register").write_text(os.path.realpath(origin))
wait(lambda: Path("/dev/bcache0").exists() and sysfs.exists(), 20)
# ... and this time its filesystem sits on a dm-linear device stacked on it (as LVM or dm-crypt would)
size = Path("/sys/block/bcache0/size").read_text().strip()
subprocess.run(["dmsetup", "create", "stacked", "--table", f"0 {size} linear /dev/bcache0 0"], check=True,
               env={**os.environ, "DM_DISABLE_UDEV": "1"})
subprocess.run(["mount", "/dev/mapper/stacked", str(mnt)], check=True)
stacked_dev = "%d:%d" % divmod(os.stat("/dev/mapper/stacked").st_rdev, 256)  # noqa: UP031 (major:minor < 256)
say("readopted", "yes" if wait(lambda: any(v["mountpoint"] == str(mnt) and v["name"] == "bcache0"
                                           and v["dev"] == stacked_dev for v in request(
    tmp / "ctl.sock", {"cmd": "status"})["volumes"]), 30) else "no")
say("knob_repinned", "yes" if wait(pinned, 30) else "no")
(sysfs / "writeback_running").write_text("0")
os.sync()
time.sleep(0.5)
sbase = dirty()
say("stacked_dirty_base", sbase)
with open(mnt / "work" / "dead-stacked", "wb") as f:
    f.write(os.urandom(4 * MIB))
    f.flush()
    os.fsync(f.fileno())
os.sync()
d1 = dirty()
say("stacked_dirty_before", d1)
os.unlink(mnt / "work" / "dead-stacked")
os.sync()
wait(lambda: dirty() <= sbase + 256 * 1024, 30)
say("stacked_dirty_after", dirty())
stacked_done = lambda: sum(1 for x in request(tmp / "ctl.sock", {"cmd": "explain"})["decisions"]  # noqa: E731
                           if x["kind"] == "discard" and x["status"] == "done" and "bytes=4194304" in x["action"])
wait(lambda: stacked_done() >= 1, 5)  # a discard made between ticks shows in explain from the next tick's snapshot
say("stacked_discard_done", stacked_done())

(sysfs / "writeback_running").write_text("1")

# SIGTERM: exit 0, the cache left as it was (mode, writeback_percent), nothing pending
d.send_signal(signal.SIGTERM)
rc = d.wait(timeout=60)
say("exit", rc)
say("mode_after", (sysfs / "cache_mode").read_text().strip())
say("wb_percent_after", (sysfs / "writeback_percent").read_text().strip())  # put back at the clean stop
a = dirty()
time.sleep(2)
say("dirty_stable", "yes" if dirty() <= a else "no")
state = json.loads((tmp / "state" / "state.json").read_text())["state"]
say("state_volumes", ",".join(state["volumes"]))
err.seek(0)
log = err.read()
say("traceback", "yes" if "Traceback" in log else "no")
say("log_reload_failed", "yes" if "reload failed, keeping the running policy" in log else "no")
print(log[-3000:])
