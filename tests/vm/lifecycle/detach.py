"""Lab: `cachepilot detach` and `attach` through a running daemon (issue 36 item 2), on two kinds in one guest boot:
the lab's bcache (writeback) volume, and a dm-writecache volume this script builds on two loop devices (tmpfs).
Both mounted; fsynced files make dirty data on each; then for each: detach through the daemon while the volume stays
mounted (bcache ``state`` "no cache"; dm-writecache a linear table over its origin), the volume still serving (a new
file written and read back), every checksum read from the *bare origin* (a read-only loop mount of it after an
fsfreeze checkpointed ext4's journal: what was dirty in the cache was written back), status listing it as detached
and not managed; then attach back (the cache set / the saved table) and the daemon adopting it again.
key=value lines on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cachepilot.backends.inspect import parse_bcache_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "act"))  # tests/vm/act: the lab helpers
from labkit import drop_caches, intact, no_congestion_bypass, quiet_policy, run, volume, write_files  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import cli_in_process, say, wait  # noqa: E402

MIB = 1 << 20
mnt = Path(os.environ["LAB_MOUNT"])
sysfs = Path(os.environ["LAB_BCACHE_SYSFS"])
origin = os.environ["LAB_ORIGIN_DEV"]
cli = str(Path(sys.executable).with_name("cachepilot"))
tmp = Path(tempfile.mkdtemp(prefix="cp-detach-"))
wc_mnt = Path("/mnt/wc")
POLICY = quiet_policy("discard_on_delete: {enabled: false}")


def cli_run(*args: str) -> tuple[int, str]:
    return cli_in_process(tmp / "ctl.sock", *args)


def status() -> dict:  # type: ignore[type-arg]
    rc, out = cli_run("status", "--json")
    return json.loads(out) if rc == 0 else {}


def managed() -> list[str]:
    return sorted(v["name"] for v in status().get("volumes", []))


def detached(name: str) -> dict[str, str]:
    return next((d for d in status().get("detached", []) if d.get("name") == name), {})


def bare_origin_intact(dev: str, offset: int, mountpoint: Path, sums: dict[str, str]) -> str:
    """The files as the origin alone holds them: ext4's journal checkpointed (fsfreeze flushes it), the origin
    mounted read-only through a loop device at the filesystem's offset, every checksum compared."""
    run("fsfreeze", "-f", str(mountpoint))
    run("fsfreeze", "-u", str(mountpoint))
    lo = run("losetup", "-r", "-o", str(offset), "-f", "--show", dev)
    bare = tmp / f"bare{offset}"
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


# ------------------------------------------------------------------ a dm-writecache volume beside the lab's bcache
subprocess.run(["modprobe", "-a", "loop", "dm-writecache"], check=False)
wc_origin_img, wc_cache_img = tmp / "wc-origin.img", tmp / "wc-cache.img"
with open(wc_origin_img, "wb") as f:
    f.truncate(96 * MIB)
wc_cache_img.write_bytes(bytes(32 * MIB))  # zeroed: dm-writecache refuses a cache without its magic otherwise
wc_origin = run("losetup", "-f", "--show", str(wc_origin_img))
wc_cache = run("losetup", "-f", "--show", str(wc_cache_img))
sectors = run("blockdev", "--getsz", wc_origin)
run("dmsetup", "create", "lab-wc", "--table", f"0 {sectors} writecache s {wc_origin} {wc_cache} 4096 0")
run("mkfs.ext4", "-q", "-F", "-E", "nodiscard", "/dev/mapper/lab-wc")
wc_mnt.mkdir(parents=True, exist_ok=True)
run("mount", "/dev/mapper/lab-wc", str(wc_mnt))
# dm-N, the daemon's name for it (no udev in the guest: /dev/mapper/lab-wc is a node, not a link to it)
wc_name = next(p.parent.parent.name for p in Path("/sys/block").glob("dm-*/dm/name")
               if p.read_text().strip() == "lab-wc")
wc_table = run("dmsetup", "table", "lab-wc")

no_congestion_bypass(volume(), "lab: dirty data for the detach to write back, on a loaded host too")
(tmp / "policy.yaml").write_text(POLICY)
(tmp / "c.yaml").write_text("version: 1\npolicies: [policy.yaml]\nstate_dir: state\nsocket: ctl.sock\ntick: 500ms\n"
                            "rescan: 2s\nstate_interval: 5s\nmetrics: {listen: ''}\n")
err = open(tmp / "stderr", "w+")
d = subprocess.Popen([cli, "run", "--config", str(tmp / "c.yaml")], stderr=err, stdout=subprocess.DEVNULL)
ok = wait(lambda: (tmp / "ctl.sock").exists() and "ready" in (tmp / "stderr").read_text(), 150)
both = ok and wait(lambda: managed() == sorted(["bcache0", wc_name]), 30)
say("ready", "yes" if both else f"no: {managed() if ok else 'not ready'}")
if not both:
    err.seek(0)
    print(err.read()[-3000:])
    sys.exit(1)

sums = write_files(mnt, "f", 8, MIB, seed=1)
wc_sums = write_files(wc_mnt, "f", 8, MIB, seed=1)
say("dirty_before", parse_bcache_size((sysfs / "dirty_data").read_text()))
f = run("dmsetup", "status", "lab-wc").split()
say("wc_used_before", int(f[4]) - int(f[5]))
cset = os.path.basename(os.readlink(sysfs / "cache"))

# ------------------------------------------------------------------ bcache: detach, verify, attach
t0 = time.monotonic()
rc, out = cli_run("detach", "bcache0", "--deadline", "120s")
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

rc, out = cli_run("attach", "bcache0")
say("attach_rc", rc)
print(out)
say("attached_cset", "yes" if (sysfs / "cache").exists() and os.path.basename(os.readlink(sysfs / "cache")) == cset
    else "no")
say("state_attached", (sysfs / "state").read_text().strip())

# ------------------------------------------------------------------ dm-writecache: detach, verify, attach
t0 = time.monotonic()
rc, out = cli_run("detach", wc_name, "--deadline", "120s")
say("wc_detach_rc", rc)
say("wc_detach_s", f"{time.monotonic() - t0:.1f}")
print(out)
linear = run("dmsetup", "table", "lab-wc")
rdev = os.stat(wc_origin).st_rdev
say("wc_table_linear", "yes" if linear.split()[2:5] == ["linear", f"{os.major(rdev)}:{os.minor(rdev)}", "0"] else "no")
say("wc_table_after", linear)
say("wc_mounted_after", "yes" if os.path.ismount(wc_mnt) else "no")
say("wc_listed_detached", "yes" if detached(wc_name).get("cache") == wc_table else f"no: {detached(wc_name)}")
drop_caches()
say("wc_files_intact_mount", intact(wc_mnt, wc_sums))
say("wc_files_intact_bare", bare_origin_intact(wc_origin, 0, wc_mnt, wc_sums))
say("wc_serving", serving(wc_mnt))

rc, out = cli_run("attach", wc_name)
say("wc_attach_rc", rc)
print(out)
say("wc_table_back", "yes" if run("dmsetup", "table", "lab-wc") == wc_table else run("dmsetup", "table", "lab-wc"))

# ------------------------------------------------------------------ both managed again, nothing lost
say("adopted_again", "yes" if wait(lambda: managed() == sorted(["bcache0", wc_name]), 20) else ",".join(managed()))
drop_caches()
say("files_intact_end", "yes" if intact(mnt, sums) == "yes" and intact(wc_mnt, wc_sums) == "yes" else "no")
d.terminate()
say("exit", d.wait(timeout=120))
err.seek(0)
log = err.read()
say("traceback", "yes" if "Traceback" in log else "no")
say("detach_logged", "yes" if log.count("operator detach started") == 2 else "no")
say("released_logged", "yes" if log.count("detached by the operator") == 2 else "no")
run("umount", str(wc_mnt))
run("dmsetup", "remove", "lab-wc")
