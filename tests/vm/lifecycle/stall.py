"""Lab: write-back stalls provoked behind the daemon's back (issue 36 items 3 and 5), one per kind that has one of its
own, all at once in one guest boot: the lab's bcache (writeback) volume, and dm-writecache, dm-cache and lvmcache
volumes built on loop devices (loopvols.py). The daemon runs with the shipped defaults but ``health.stall_after: 20s``
and bcache's ``writeback_delay`` 10 (recoverable: no drain of its own); Debian's prometheus runs in the guest too,
scraping the daemon every 5 s with the shipped rules. The stalls:
- bcache: ``echo 0 > writeback_running`` with ~8 MiB dirty;
- dm-writecache (stock table): filled past its high watermark while an fsync loop runs -- every flush sends a write
  to the origin (``writecache_map_flush``), and write-back waits until the origin has had none for pause_writeback
  (3 s by default), so nothing is written back;
- dm-cache (smq): dirty blocks, while 4 KiB writes to uncached blocks keep its origin busy -- smq cleans nothing until
  the origin has been idle for a second (``clean_target_met``);
- lvmcache (an LVM cache LV: dm-cache with smq under LVM's table): the same, the cause said in LVM's terms.
Measured for each: when the daemon's status says stalled, when ``CachepilotWriteBackStalled`` fires in Prometheus,
what explain says -- and that writeback_running still reads 0 (the daemon does not undo the operator's knob). Then
each is ended (``echo 1``; the writers stopped). key=value lines on stdout."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cachepilot.backends.inspect import parse_bcache_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "act"))  # tests/vm/act: the lab helpers
from labkit import dirty_on_smq, quiet_policy, run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say, wait  # noqa: E402
from labdaemon import LabDaemon  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopvols  # noqa: E402

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "dashboards" / "prometheus" / "cachepilot.rules.yml"
METRICS, PROM = "127.0.0.1:9854", "127.0.0.1:9090"
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
tmp = Path(tempfile.mkdtemp(prefix="cp-stall-"))
# A stall is judged after max(stall_after, 2 x writeback_delay) (bcache may rest that long by design: the models'
# WritebackView.quiet_s): 20 s each here, where stock writeback_delay 30 made it 60 s (62 and 61 measured with
# stall_after 45s) -- 40 s of the suite. The dirty data the stall needs: neither a sequential nor a congestion
# bypass of the writes (labkit.NO_CONGESTION; 16 files of 1 MiB in a row were 13 MiB bypassed as sequential once).
POLICY = quiet_policy("health: {stall_after: 20s}", "knobs: {writeback_percent: 40, writeback_delay: 10,"
                      " sequential_cutoff: 0, congested_read_threshold_us: 0, congested_write_threshold_us: 0}")


def dirty() -> int:
    return parse_bcache_size((sysfs / "dirty_data").read_text())


def volume_status(name: str = "bcache0") -> dict[str, Any]:
    rc, out = d.cli("status", "--json")
    vols = json.loads(out).get("volumes", []) if rc == 0 else []
    return next((v for v in vols if v["name"] == name), {})


def stalled(name: str) -> bool:
    return bool((volume_status(name).get("writeback") or {}).get("stalled"))


def firing(name: str = "bcache0") -> list[dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{PROM}/api/v1/alerts", timeout=5) as r:
            alerts = json.load(r)["data"]["alerts"]
    except OSError:
        return []
    return [a for a in alerts if a["labels"].get("alertname") == "CachepilotWriteBackStalled"
            and a["labels"].get("device") == name and a["state"] == "firing"]  # device: the kernel's name


def prom_query(expr: str) -> list[dict[str, Any]]:
    url = f"http://{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)["data"]["result"]  # type: ignore[no-any-return]
    except OSError:
        return []


def wc_used() -> int:
    f = run("dmsetup", "status", wc.dm_name).split()
    return int(f[4]) - int(f[5])  # total - free blocks: every used block is dirty


def smq_dirty(v: loopvols.LoopVol) -> int:
    """dm-cache's dirty blocks (lvmcache's too: the same target)."""
    return int(run("dmsetup", "status", v.dm_name).split()[13])


def forever(what: Callable[[], None], pause: float) -> int:
    """A child process doing ``what`` every ``pause`` seconds until it is killed (its pid): a process of its own, so
    that the CLI calls of this one never leave the device idle for a second."""
    pid = os.fork()
    if pid == 0:
        try:
            while True:
                what()
                time.sleep(pause)
        finally:
            os._exit(0)
    return pid


def fsync_loop() -> None:
    """One 4 KiB block rewritten in place and fsynced: each fsync's flush sends a write to dm-writecache's origin.
    In place: a truncating rewrite frees the old block each time, and the daemon's discard of it frees its cache
    entry -- used blocks falling by one a second, which restarts the stall's clock (lab run 2: found after 37 s)."""
    fd = os.open(wc.mount / "tick", os.O_WRONLY | os.O_CREAT)
    try:
        os.pwrite(fd, os.urandom(4096), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


BUSY = 32 * MIB  # fallocated (unwritten: nothing of it cached); 4 KiB writes at random places are write misses
BUF = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants


def busy_write(mount: Path) -> None:
    """One 4 KiB O_DIRECT write at a random place of the busy file: a write miss dm-cache sends to its origin."""
    fd = os.open(mount / "busy", os.O_WRONLY | os.O_DIRECT)
    try:
        os.pwrite(fd, BUF, random.randrange(BUSY // 4096) * 4096)  # noqa: S311 (test load)
    finally:
        os.close(fd)


def busy_smq(v: loopvols.LoopVol, n: int, size: int) -> int:
    """A dm-cache (or lvmcache) volume's stall: the busy writer first (the origin never idles for a second), then
    dirty blocks (smq's own way, ``n`` files of ``size``); the writer's pid."""
    fd = os.open(v.mount / "busy", os.O_WRONLY | os.O_CREAT)
    os.posix_fallocate(fd, 0, BUSY)
    os.close(fd)
    pid = forever(lambda: busy_write(v.mount), 0.1)
    dirty_on_smq(v.mount, "f", n, size)
    return pid


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


T0 = time.monotonic()
# the busybox guest leaves lo down (only the systemd one brings it up): the metrics are scraped over it
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
# Prometheus first: it takes a while to start under TCG, the daemon meanwhile
# every 5 s: a scrape of the daemon under TCG can take seconds (a 2 s scrape timed out: up stayed 0)
(tmp / "prometheus.yml").write_text(yaml.safe_dump({
    "global": {"scrape_interval": "5s", "scrape_timeout": "5s", "evaluation_interval": "5s"},
    "rule_files": [str(RULES)],
    "scrape_configs": [{"job_name": "cachepilot", "static_configs": [{"targets": [METRICS]}]}]}))
plog = open(tmp / "prometheus.log", "w")
prom = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                         f"--web.listen-address={PROM}"], stdout=subprocess.DEVNULL, stderr=plog)
# the dm volumes beside the lab's bcache, before the daemon starts: it adopts all four (lvmcache exports its lvm.conf
# as LVM_SYSTEM_DIR first: the daemon's lvs and lvchange read it)
wc, dmc = loopvols.writecache(tmp), loopvols.dmcache(tmp)
t_lvm = time.monotonic()
lvm = loopvols.lvmcache(tmp)
say("lvm_setup_s", f"{time.monotonic() - t_lvm:.1f}")
d = LabDaemon(tmp, POLICY, metrics=METRICS)
ok = d.ready(180)
say("daemon_ready_s", f"{time.monotonic() - T0:.1f}")
ok = ok and wait(lambda: prom_query('up{job="cachepilot"} == 1'), 180, step=1)
say("ready", "yes" if ok else "no")
say("ready_s", f"{time.monotonic() - T0:.1f}")
if not ok:
    targets = ""
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{PROM}/api/v1/targets", timeout=5) as r:
        targets = "targets: " + r.read().decode()[-2000:]
    d.fail((tmp / "prometheus.log").read_text()[-2000:], targets)

names = {"bcache": "bcache0", "wc": wc.kname, "dmc": dmc.kname, "lvm": lvm.kname}
ok = wait(lambda: all(volume_status(n) for n in names.values()), 60, step=1)
say("managed", "yes" if ok else "no")
if not ok:
    d.fail()
t_stop: dict[str, float] = {}

# dm-writecache: the fsync loop first (write-back then waits from the start), then filled past its high watermark
# (50% of its blocks in use, each dirty): dirty data the stock table would write back at once, but does not
wc_pid = forever(fsync_loop, 0.5)
total = int(run("dmsetup", "status", wc.dm_name).split()[4])
for i in range(40):
    if wc_used() >= total * 7 // 10:
        break
    with open(wc.mount / f"w{i:02d}", "wb") as f:
        f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())
t_stop["wc"] = time.monotonic()
say("wc_used_before", wc_used())
say("wc_total", total)

# dm-cache: kept busy, then dirtied
dmc_pid = busy_smq(dmc, 4, 4 * MIB)
t_stop["dmc"] = time.monotonic()
say("dmc_dirty_before", smq_dirty(dmc))

# bcache: dirty data that stays, then write-back stopped behind the daemon's back
# 8 MiB: twice what the test asks; the stall is judged from when dirty data stops falling, and with 20 MiB the
# write-back bcache had in flight at the echo took 30 s to land (detected 55 s after it, 23 s with 3.5 MiB)
for i in range(8):
    with open(mnt / f"s{i:02d}", "wb") as f:
        f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())
(sysfs / "writeback_running").write_text("0\n")
t_stop["bcache"] = time.monotonic()
say("dirty_before", dirty())
say("running_after_echo", (sysfs / "writeback_running").read_text().strip())

# lvmcache as dm-cache, provoked last: bcache's stall takes the longest to alert (bcache rests 2 x writeback_delay
# first), so this one's provocation runs while the test waits for that anyway; half as much dirtied (the test asks
# for 16 blocks)
t_lvm = time.monotonic()
lvm_pid = busy_smq(lvm, 2, 4 * MIB)
t_stop["lvm"] = time.monotonic()
say("lvm_dirty_s", f"{t_stop['lvm'] - t_lvm:.1f}")
say("lvm_dirty_before", smq_dirty(lvm))

# all four watched at once: when each is found, then when each alert fires
KEY = {"bcache": "", "wc": "wc_", "dmc": "dmc_", "lvm": "lvm_"}


def when_each(seen: Callable[[str], Any], within: float = 150) -> dict[str, tuple[float, Any]]:
    """For each kind, when ``seen(volume)`` first gave something true, and what: all polled at once, each second."""
    got: dict[str, tuple[float, Any]] = {}
    end = time.monotonic() + within
    while len(got) < len(names) and time.monotonic() < end:
        for k, n in names.items():
            if k not in got and (what := seen(n)):
                got[k] = (time.monotonic(), what)
        time.sleep(1)
    return got


found = when_each(stalled)
for k, n in names.items():
    say(f"{KEY[k]}detected_s", f"{found[k][0] - t_stop[k]:.0f}" if k in found else "never")
    print(f"{n} cause:", (volume_status(n).get("writeback") or {}).get("cause"))
CAUSE = {"bcache": "writeback_running is 0", "wc": "pause_writeback (3000 ms, the kernel's default)",
         "dmc": "dm-cache's smq cleans only once the origin has been idle for a second",
         "lvm": "lvmcache's smq (dm-cache under LVM) cleans only once the origin has been idle for a second"}
for k, n in names.items():
    cause = str((volume_status(n).get("writeback") or {}).get("cause"))
    say(f"{KEY[k]}cause_names_{'knob' if k == 'bcache' else 'hold'}", "yes" if CAUSE[k] in cause else "no")
# when each fired and its severity as it fired: asked again later, an alert may have ended meanwhile (a mutant
# run, waiting 150 s for a stall never found, saw dm-cache's end and the script crash on its empty list)
fired = when_each(lambda n: (alerts := firing(n)) and alerts[0]["labels"]["severity"])
for k, n in names.items():
    say(f"{KEY[k]}alert_s", f"{fired[k][0] - t_stop[k]:.0f}" if k in fired else "never")
    say(f"{KEY[k]}alert_severity", fired[k][1] if k in fired else "none")
    gauge = prom_query(f'cachepilot_volume_writeback_stalled{{device="{n}"}}')
    say(f"{KEY[k]}gauge_in_prometheus", gauge[0]["value"][1] if gauge else "none")
    rc, out = d.cli("explain", "--volume", n)
    say(f"{KEY[k]}explain_says", "yes" if "writeback_stall => found" in out and CAUSE[k] in out else "no")
    print(out[-1500:])
# the dm kinds: the stall was theirs, not a stuck origin -- still dirty as found
say("wc_used_held", wc_used())
say("dmc_dirty_held", smq_dirty(dmc))
say("lvm_dirty_held", smq_dirty(lvm))
say("lvm_lvs_dirty", loopvols.lvs("cache_dirty_blocks"))  # the runbook's command: LVM's view of the same blocks
# the daemon left the operator's knob as it was, and wrote nothing to it
say("running_still", (sysfs / "writeback_running").read_text().strip())
rc, out = d.cli("explain", "--volume", "bcache0", "--json")
wrote = [w for dec in json.loads(out) for w in dec["writes"] if "writeback_running" in w["target"]] if rc == 0 else [1]
say("daemon_wrote_running", "yes" if wrote else "no")

# each ended: the operator turns bcache's write-back on again (bcache holds this little dirty data below its target on
# purpose); the writers stop, and each dm kind writes back again (dm-writecache 3 s after the origin's last write,
# down to its low watermark; dm-cache and lvmcache once the origin has been idle for a second)
(sysfs / "writeback_running").write_text("1\n")
stop(wc_pid)
stop(dmc_pid)
stop(lvm_pid)
for k, n in names.items():
    ended = wait(lambda n=n: not stalled(n), 60, step=1)  # type: ignore[misc]
    say(f"{KEY[k]}ended", "yes" if ended else "no")
log = d.stop()
prom.terminate()
prom.wait(timeout=60)
say("logged", "yes" if "writeback_stall found" in log else "no")
