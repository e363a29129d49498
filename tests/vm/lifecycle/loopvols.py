"""Cached volumes a lab script builds beside the lab's own (tests/vm/lifecycle/detach.py), each on loop devices over
files in tmpfs, mounted (ext4): dm-writecache, dm-cache and an LVM cache LV (lvmcache). The cache devices sit under
a dm-linear of their own, so that a script can fail one (its table reloaded to ``error``) as lab-fail-cache does
for the lab's cache device. Each comes back as a :class:`LoopVol`."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from labkit import run

MIB = 1 << 20


@dataclass
class LoopVol:
    dm_name: str  # the cached device's dm name (lab-wc, lab-dmc, labvg-cached)
    mount: Path
    origin: str  # the origin's block device: the bare origin, read after a detach
    cache_linears: tuple[str, ...] = ()  # the dm-linears under its cache (what a failure test reloads to error)

    @property
    def kname(self) -> str:
        """dm-N, the daemon's name for it (no udev in the guest: /dev/mapper/NAME is a node, not a link to it)."""
        return next(p.parent.parent.name for p in Path("/sys/block").glob("dm-*/dm/name")
                    if p.read_text().strip() == self.dm_name)

    def table(self) -> str:
        return run("dmsetup", "table", self.dm_name)


def _modules(*names: str) -> None:
    """The loop driver and the targets (the guest loads none of them until asked)."""
    subprocess.run(["modprobe", "-a", "loop", *names], check=False)


def _loop(tmp: Path, name: str, mib: int) -> str:
    img = tmp / f"{name}.img"
    with open(img, "wb") as f:
        f.truncate(mib * MIB)  # sparse zeros: dm-writecache and dm-cache metadata want a zeroed start
    return run("losetup", "-f", "--show", str(img))


def _linear(name: str, dev: str, start: int = 0, sectors: int = 0) -> str:
    sectors = sectors or int(run("blockdev", "--getsz", dev))
    run("dmsetup", "create", name, "--table", f"0 {sectors} linear {dev} {start}")
    return f"/dev/mapper/{name}"


def _mkfs_mount(dev: str, mnt: Path) -> None:
    run("mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev)
    mnt.mkdir(parents=True, exist_ok=True)
    run("mount", dev, str(mnt))


def fail(linear: str) -> str:
    """Every I/O to the device under ``linear`` fails from now on (its table reloaded to ``error``); the table."""
    table = f"0 {run('blockdev', '--getsz', f'/dev/mapper/{linear}')} error"
    run("dmsetup", "suspend", "--noflush", linear)
    run("dmsetup", "load", linear, "--table", table)
    run("dmsetup", "resume", linear)
    return table


def writecache(tmp: Path) -> LoopVol:
    _modules("dm-writecache")
    origin, cache = _loop(tmp, "wc-origin", 96), _loop(tmp, "wc-cache", 32)
    cdev = _linear("lab-wcc", cache)
    sectors = run("blockdev", "--getsz", origin)
    run("dmsetup", "create", "lab-wc", "--table", f"0 {sectors} writecache s {origin} {cdev} 4096 0")
    v = LoopVol("lab-wc", Path("/mnt/wc"), origin, ("lab-wcc",))
    _mkfs_mount("/dev/mapper/lab-wc", v.mount)
    return v


def dmcache(tmp: Path, name: str = "lab-dmc", mount: Path = Path("/mnt/dmc")) -> LoopVol:
    """16 MiB of metadata and 48 MiB of 64 KiB cache blocks in writeback with smq, as the lab's dmcache recipe: both
    on one loop device, under dm-linears ``NAME-meta`` and ``NAME-data``."""
    _modules("dm-cache", "dm-cache-smq")
    origin, cache = _loop(tmp, f"{name}-origin", 96), _loop(tmp, f"{name}-cache", 64)
    meta = _linear(f"{name}-meta", cache, 0, 32768)
    data = _linear(f"{name}-data", cache, 32768, 65536 * 2 - 32768)
    sectors = run("blockdev", "--getsz", origin)
    run("dmsetup", "create", name, "--table", f"0 {sectors} cache {meta} {data} {origin} 128 1 writeback smq 0")
    v = LoopVol(name, mount, origin, (f"{name}-meta", f"{name}-data"))
    _mkfs_mount(f"/dev/mapper/{name}", v.mount)
    return v


def lvmcache(tmp: Path) -> LoopVol:
    """An LVM cache LV as the lab's lvmcache recipe makes it (pool ``cpool``, 64 KiB chunks, writeback smq), on two
    loop devices. Its own lvm.conf, exported as LVM_SYSTEM_DIR with DM_DISABLE_UDEV (no udev in the guest) for
    every lvm command after it, the daemon's included: only these two loops are PVs."""
    _modules("dm-cache", "dm-cache-smq")  # the loop driver too: this may be the first volume a script builds
    origin, cache = _loop(tmp, "lvm-origin", 96), _loop(tmp, "lvm-cache", 64)
    conf = tmp / "lvm"
    conf.mkdir()
    (conf / "lvm.conf").write_text(
        "devices {\n"
        f'    filter = [ "a|^{origin}$|", "a|^{cache}$|", "r|.*|" ]\n'
        "    obtain_device_list_from_udev = 0\n    use_devicesfile = 0\n}\n"
        "activation {\n    udev_sync = 0\n    udev_rules = 0\n}\n"
        "backup {\n    backup = 0\n    archive = 0\n}\n")
    os.environ.update(LVM_SYSTEM_DIR=str(conf), DM_DISABLE_UDEV="1")
    run("lvm", "pvcreate", "-y", "-ff", origin, cache)
    run("lvm", "vgcreate", "labvg", origin, cache)
    run("lvm", "lvcreate", "-y", "-n", "cached", "-l", "100%PVS", "labvg", origin)
    run("lvm", "lvcreate", "-y", "--type", "cache-pool", "--poolmetadataspare", "n", "--chunksize", "64k",
        "-n", "cpool", "-l", "100%PVS", "labvg", cache)
    run("lvm", "lvconvert", "-y", "--type", "cache", "--cachepool", "labvg/cpool", "--cachemode", "writeback",
        "--cachepolicy", "smq", "labvg/cached")
    v = LoopVol("labvg-cached", Path("/mnt/lvm"), origin)
    _mkfs_mount("/dev/mapper/labvg-cached", v.mount)
    return v


def lvs(field: str, lv: str = "labvg/cached") -> str:
    return run("lvm", "lvs", "--noheadings", "-o", field, lv).strip()
