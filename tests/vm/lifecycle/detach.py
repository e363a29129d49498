"""Lab: `cachepilot detach` and `attach` through a running daemon (issue 36 items 2 and 5), on all four kinds in one
guest boot: the lab's bcache (writeback) volume, and dm-writecache, dm-cache and lvmcache volumes built on loop
devices (tmpfs, loopvols.py). All mounted; fsynced files make dirty data on each; then for each: detach through the
daemon while the volume stays mounted (bcache ``state`` "no cache"; dm kinds a linear table over the origin;
lvmcache ``lvconvert --splitcache``, the LV linear), the volume still serving (a new file written and read back),
every checksum read from the *bare origin* (a read-only loop mount of it after an fsfreeze checkpointed ext4's
journal: what was dirty in the cache was written back), status listing it as detached and not managed; then attach
back (the cache set / the saved table / the split pool) and the daemon adopting it again.
Last, a failing cache with dirty data (dm-writecache's cache device reloaded to ``error``): detach refused with
the bytes named (exit 2), then ``--accept-loss`` leaves the volume on its origin. key=value lines on stdout."""

from __future__ import annotations

import contextlib
import io
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cachepilot.backends.inspect import parse_bcache_size
from cachepilot.backends.operation import FAILURE_COMMIT_S

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "act"))  # tests/vm/act: the lab helpers
from labkit import dirty_on_smq, drop_caches, intact, no_congestion_bypass, quiet_policy, run, write_files  # noqa: E402
from labkit import volume as lab_volume  # noqa: E402  (the lab's bcache backend; volume() here is status's)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say, wait  # noqa: E402
from labdaemon import LabDaemon  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopvols  # noqa: E402

MIB = 1 << 20
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
origin = os.environ["LAB_ORIGIN_DEV"]
tmp = Path(tempfile.mkdtemp(prefix="cp-detach-"))
POLICY = quiet_policy("discard_on_delete: {enabled: false}")
T0 = time.monotonic()


def mark(what: str) -> None:
    say(f"t_{what.replace(' ', '_')}", f"{time.monotonic() - T0:.1f}")  # where the time goes (seconds since the start)


def status() -> dict:  # type: ignore[type-arg]
    rc, out = d.cli("status", "--json")
    return json.loads(out) if rc == 0 else {}


def managed() -> list[str]:
    return sorted(v["name"] for v in status().get("volumes", []))


def volume(name: str) -> dict:  # type: ignore[type-arg]
    return next((v for v in status().get("volumes", []) if v.get("name") == name), {})


def detached(name: str) -> dict[str, str]:
    return next((x for x in status().get("detached", []) if x.get("name") == name), {})


def bare_origin_intact(dev: str, offset: int, mountpoint: Path, sums: dict[str, str]) -> str:
    """The files as the origin alone holds them: ext4's journal checkpointed (fsfreeze flushes it), the origin
    mounted read-only through a loop device at the filesystem's offset, every checksum compared."""
    run("fsfreeze", "-f", str(mountpoint))
    run("fsfreeze", "-u", str(mountpoint))
    lo = run("losetup", "-r", "-o", str(offset), "-f", "--show", dev)
    bare = tmp / f"bare{len(list(tmp.glob('bare*')))}"
    bare.mkdir()
    try:
        run("mount", "-o", "ro,noload", lo, str(bare))
        try:
            return intact(bare, sums)
        finally:
            run("umount", str(bare))
    finally:
        run("losetup", "-d", lo)


def serving(mountpoint: Path) -> str:
    """A new file written, fsynced and read back through the mounted volume."""
    data = os.urandom(256 << 10)
    p = mountpoint / "after-detach"
    with open(p, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    drop_caches()
    return "yes" if p.read_bytes() == data else "no"


def hot_export(name: str, out: Path) -> tuple[int, int, str]:
    """`cachepilot hotlist export NAME --config C --out FILE` as docs/operate.md's replace-a-cache walk-through runs
    it (the hot list the daemon's state file holds: written every state_interval): exit code, files, what it said."""
    from cachepilot.cli import main

    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        rc = main(["hotlist", "export", name, "--config", str(tmp / "c.yaml"), "--out", str(out)])
    files = len(json.loads(out.read_text())["files"]) if rc == 0 and out.exists() else 0
    return rc, files, said.getvalue().strip()


def first_mib(dev: str) -> bytes:
    """The device's first MiB as the device returns it (O_DIRECT: not the page cache, where a mounted ext4 keeps
    its own superblock and descriptors). A direct read first waits on the device's page-cache writeback and returns
    an error recorded there once (ext4's writes that failed on the failed cache: EIO, lab run 7), so it is read
    again once."""
    buf = mmap.mmap(-1, MIB)  # page-aligned, as O_DIRECT wants
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        try:
            os.readv(fd, [buf])
        except OSError:
            os.readv(fd, [buf])
    finally:
        os.close(fd)
    return bytes(buf)


def linear_over(v: loopvols.LoopVol) -> int | None:
    """The sector the live table maps the origin from, if it is one linear target over v's origin; else None."""
    f = v.table().split()
    rdev = os.stat(v.origin).st_rdev
    return int(f[4]) if f[2:4] == ["linear", f"{os.major(rdev)}:{os.minor(rdev)}"] else None


def same_devices(a: str, b: str) -> bool:
    """Two dm cache/writecache tables over the same devices (metadata, cache, origin) and block size: the cache a
    detach saved is the table live when it ran, which the operator's drain had made write-through (dm-cache)."""
    fa, fb = a.split(), b.split()
    return fa[:3] == fb[:3] and fa[3:7] == fb[3:7]


def detach_dm(p: str, v: loopvols.LoopVol, sums: dict[str, str], cache: str) -> None:
    """A dm volume (prefix ``p`` on its keys): detach, the linear table over the bare origin, the files on it,
    status's record of the ``cache`` attach puts back (a table over the same devices, or lvmcache's pool), then
    attach."""
    t0 = time.monotonic()
    rc, out = d.cli("detach", v.kname, "--deadline", "120s")
    say(f"{p}_detach_rc", rc)
    say(f"{p}_detach_s", f"{time.monotonic() - t0:.1f}")
    print(out)
    at = linear_over(v)
    say(f"{p}_table_linear", "yes" if at is not None else "no")
    say(f"{p}_table_after", v.table())
    say(f"{p}_mounted_after", "yes" if os.path.ismount(v.mount) else "no")
    rec = detached(v.kname)
    saved = str(rec.get("cache", ""))
    same = saved == cache if "/" in cache else same_devices(saved, cache)
    say(f"{p}_listed_detached", "yes" if same and v.kname not in managed() else f"no: {rec}")
    drop_caches()
    say(f"{p}_files_intact_mount", intact(v.mount, sums))
    say(f"{p}_files_intact_bare", bare_origin_intact(v.origin, (at or 0) * 512, v.mount, sums))
    say(f"{p}_serving", serving(v.mount))
    rc, out = d.cli("attach", v.kname)
    say(f"{p}_attach_rc", rc)
    print(out)
    if "/" not in cache:
        # the saved table over the same devices (by the time attach returns, the policy may have switched the mode:
        # dm-cache comes back write-through, as the detach's drain left it, and recoverable wants write-back)
        back = v.table()
        say(f"{p}_table_back", "yes" if back == saved or same_devices(back, saved) else f"no: {back} (saved {saved})")
    mark(f"{p} done")


# ------------------------------------------------------------------ the volumes beside the lab's bcache
# bcache sleeps writeback_delay (30 s by default) after each full scan of its dirty keys, and no sysfs write cuts a
# sleep begun short: pinned low before any dirty data, so that the detach's drain does not wait out 30 s.
(sysfs / "writeback_delay").write_text("1\n")
subprocess.run(["modprobe", "-a", "loop", "dm-writecache"], check=False)
wc = loopvols.writecache(tmp)
dmc = loopvols.dmcache(tmp)
lvm = loopvols.lvmcache(tmp)  # exports LVM_SYSTEM_DIR before the daemon starts: its lvconvert reads it
wc_table, dmc_table = wc.table(), dmc.table()
mark("volumes built")

no_congestion_bypass(lab_volume(), "lab: dirty data for the detach to write back, on a loaded host too")
d = LabDaemon(tmp, POLICY, tick="500ms", rescan="2s")
everyone = sorted(["bcache0", wc.kname, dmc.kname, lvm.kname])
ok = d.ready(150)
ok = ok and wait(lambda: managed() == everyone, 30)
say("ready", "yes" if ok else f"no: {managed()}")
if not ok:
    d.fail()
mark("daemon ready")

sums = write_files(mnt, "f", 8, MIB, seed=1)
wc_sums = write_files(wc.mount, "f", 8, MIB, seed=1)
os.sync()
say("dirty_before", parse_bcache_size((sysfs / "dirty_data").read_text()))
f = run("dmsetup", "status", "lab-wc").split()
say("wc_used_before", int(f[4]) - int(f[5]))
cset = os.path.basename(os.readlink(sysfs / "cache"))
mark("dirty data made")

# ------------------------------------------------------------------ bcache: detach, verify, attach
# docs/operate.md's "replace a cache device": the hot list exported first (once the state file holds it)
hot = tmp / "bcache0.hot"
wait(lambda: hot_export("bcache0", hot)[1] > 0, 15, step=1)
rc, n, said = hot_export("bcache0", hot)
say("hot_export_rc", rc)
say("hot_export_files", n)
print(said)
t0 = time.monotonic()
rc, out = d.cli("detach", "bcache0", "--deadline", "120s")
say("detach_rc", rc)
say("detach_s", f"{time.monotonic() - t0:.1f}")
say("detach_said", "yes" if "bcache0: detached" in out else "no")
print(out)
say("state_after", (sysfs / "state").read_text().strip())
say("cache_link_after", "yes" if (sysfs / "cache").exists() else "no")
say("mounted_after", "yes" if os.path.ismount(mnt) else "no")
rec = detached("bcache0")
say("listed_detached", "yes" if rec.get("why") == "detached" and rec.get("cache") == cset else f"no: {rec}")
say("managed_after_detach", ",".join(managed()))
drop_caches()
say("files_intact_mount", intact(mnt, sums))
say("files_intact_bare", bare_origin_intact(origin, 8192, mnt, sums))  # bcache's data offset: 16 sectors
say("serving", serving(mnt))

rc, out = d.cli("attach", "bcache0", cset)  # the walk-through names the (new) set; here the same one
say("attach_rc", rc)
print(out)
say("attached_cset", "yes" if (sysfs / "cache").exists() and os.path.basename(os.readlink(sysfs / "cache")) == cset
    else "no")
say("state_attached", (sysfs / "state").read_text().strip())
# the walk-through's last step: the exported list handed to the daemon for re-warming, once it manages bcache0 again
wait(lambda: "bcache0" in managed(), 20)
rc, out = d.cli("hotlist", "import", "bcache0", str(hot))
say("hot_import_rc", rc)
say("hot_import_said", out.strip().replace("\n", " | "))
mark("bcache done")

# ------------------------------------------------------------------ the dm kinds: the same, each its own way back
detach_dm("wc", wc, wc_sums, wc_table)
say("wc_table_same", "yes" if wc.table() == wc_table else wc.table())  # dm-writecache has no other mode
# dm-cache writes dirty blocks back once its origin has idled for a second: its dirty data is made just before
# its detach (and said), else the detach would find it clean
dmc_sums = dirty_on_smq(dmc.mount, "f", 4, 2 * MIB)
say("dmc_dirty_blocks_before", run("dmsetup", "status", "lab-dmc").split()[13])
detach_dm("dmc", dmc, dmc_sums, dmc_table)
lvm_sums = dirty_on_smq(lvm.mount, "f", 4, 2 * MIB)
say("lvm_dirty_blocks_before", run("dmsetup", "status", "labvg-cached").split()[13])
detach_dm("lvm", lvm, lvm_sums, "labvg/cpool")
say("lvm_segtype_back", loopvols.lvs("segtype"))
say("lvm_pool_back", loopvols.lvs("pool_lv"))

# ------------------------------------------------------------------ all managed again, nothing lost
say("adopted_again", "yes" if wait(lambda: managed() == everyone, 20) else ",".join(managed()))
drop_caches()
say("files_intact_end", "yes" if all(intact(m, s) == "yes" for m, s in
                                     ((mnt, sums), (wc.mount, wc_sums), (dmc.mount, dmc_sums),
                                      (lvm.mount, lvm_sums))) else "no")
mark("all attached again")

# ------------------------------------------------------------------ a failing cache holding dirty data (item 5)
def fail_then_detach(p: str, v: loopvols.LoopVol, dirty: Callable[[], int]) -> None:
    """``dirty()`` makes dirty data (and says how much), then every device under v's cache fails (dm-error), an I/O
    makes the target see it, the daemon latches it; detach is refused with the bytes named (exit 2), then
    ``--accept-loss`` loads the linear table over the origin without asking the failed cache for anything."""
    say(f"{p}_dirty", dirty())
    for linear in v.cache_linears:
        say(f"{p}_fail_table", loopvols.fail(linear))
    t_fail = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={v.mount / 'h'}", "bs=64k", "count=4", "oflag=direct", "conv=fsync"],
                   capture_output=True, timeout=60, check=False)
    # dm-cache notices only when it next commits its metadata (the failed commit puts it in fail mode): its data
    # I/O errors, even an fsync, left it reporting as before for 30 s (lab runs 5-7 of h36e), and it commits on its
    # own only when its metadata changed. Nobody here commits (--noflush: status as the daemon's ticks read it): the
    # daemon's own committing sample, every FAILURE_COMMIT_S, must find it.
    say(f"{p}_status_after", run("dmsetup", "status", "--noflush", v.dm_name))
    seen = wait(lambda: volume(v.kname).get("latched"), FAILURE_COMMIT_S + 15, step=0.5)
    say(f"{p}_seen", "yes" if seen else f"no: {volume(v.kname)}")
    say(f"{p}_seen_s", f"{time.monotonic() - t_fail:.1f}")
    say(f"{p}_status_seen", run("dmsetup", "status", "--noflush", v.dm_name))
    rc, out = d.cli("detach", v.kname, "--deadline", "5s")
    say(f"{p}_refused_rc", rc)
    say(f"{p}_refused_line", out.strip().replace("\n", " | "))
    say(f"{p}_dirty_named", out.split(" dirty bytes")[0].rsplit(" ", 1)[-1] if " dirty bytes" in out else "")
    t0 = time.monotonic()
    rc, out = d.cli("detach", v.kname, "--accept-loss", "--deadline", "60s")
    say(f"{p}_accept_rc", rc)
    say(f"{p}_accept_s", f"{time.monotonic() - t0:.1f}")
    print(out)
    say(f"{p}_table_linear", "yes" if linear_over(v) == 0 else v.table())
    if rc:
        print("\n".join(run("dmesg").splitlines()[-20:]))
    say(f"{p}_listed_detached", "yes" if detached(v.kname) else f"no: {status().get('detached')}")
    # the volume reads its origin now: its first MiB is the origin's
    try:
        same = first_mib(f"/dev/mapper/{v.dm_name}") == first_mib(v.origin)
        say(f"{p}_reads_origin", "yes" if same else "no")
    except OSError as exc:
        say(f"{p}_reads_origin", f"no: {exc}")
        print(v.table(), "\n".join(run("dmesg").splitlines()[-25:]))
    mark(f"{p} done")


def wc_dirty() -> int:
    write_files(wc.mount, "g", 4, MIB, seed=3)
    f = run("dmsetup", "status", "lab-wc").split()
    return int(f[4]) - int(f[5])  # used blocks


def dmc_dirty() -> int:
    # back in write-back first: attach put back the write-through table the detach's drain left; the policy
    # (recoverable) switches it
    say("dmc_writeback_again", "yes" if wait(lambda: " writeback " in dmc.table(), 30) else dmc.table())
    dirty_on_smq(dmc.mount, "g", 4, 2 * MIB)
    return int(run("dmsetup", "status", "lab-dmc").split()[13])  # dirty blocks


# dm-writecache: its status's error field set, used blocks still counted. dm-cache: its metadata commit fails and
# its status turns to "Error"/"Fail", no figures: the bytes named are the last reading before the failure.
fail_then_detach("fail", wc, wc_dirty)
fail_then_detach("dmcfail", dmc, dmc_dirty)

log = d.stop()
print("\n".join(x for x in log.splitlines() if dmc.kname in x and "tick overran" not in x)[-4000:])
say("detach_logged", "yes" if log.count("operator detach started") == 6 else log.count("operator detach started"))
say("released_logged", "yes" if log.count("detached by the operator") == 6 else log.count("detached by the operator"))
for m in (wc.mount, dmc.mount, lvm.mount):
    subprocess.run(["umount", "-l", str(m)], check=False)
