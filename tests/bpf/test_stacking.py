"""Stacked layouts and shared devices: a filesystem on a device stacked on the volume gets its file hotness at the
volume (host: a direct-I/O loop device over the volume's loop device; lab: dm-linear on bcache, see
tests/vm/test_bpf_lab.py), and a device below several volumes counts for each of them."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from bpf_support import IMG_DIR, child, collect, run, settle

from cachepilot.events import Discard, HotnessDelta, kdev_from_st_dev
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf

# In the lab guest: a filesystem on dm-linear over the cached volume, set up by the lab test
LAB_STACK_UPPER = os.environ.get("LAB_STACK_UPPER", "")
LAB_STACK_LOWER = os.environ.get("LAB_STACK_LOWER", "")
LAB_STACK_MOUNT = os.environ.get("LAB_STACK_MOUNT", "")


def kdev(path: str) -> int:
    return kdev_from_st_dev(os.stat(path).st_rdev)


@contextlib.contextmanager
def loop(backing: str, *opts: str) -> Iterator[str]:
    dev = run("losetup", "--find", "--show", *opts, backing).stdout.strip()
    try:
        yield dev
    finally:
        run("losetup", "-d", dev, check=False)


@contextlib.contextmanager
def stacked() -> Iterator[tuple[int, int, Path]]:
    """(volume dev, upper dev, mountpoint of the filesystem on the upper device)."""
    if LAB_STACK_UPPER:
        yield kdev(LAB_STACK_LOWER), kdev(LAB_STACK_UPPER), Path(LAB_STACK_MOUNT)
        return
    image = IMG_DIR / f"cachepilot-stack-{uuid.uuid4().hex[:8]}.img"
    mnt = Path(tempfile.mkdtemp(prefix="cachepilot-stack-"))
    try:
        with open(image, "wb") as f:
            f.truncate(128 << 20)
        with loop(str(image)) as lower, loop(lower, "--direct-io=on") as upper:
            run("mkfs.ext4", "-F", "-q", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
                upper)
            run("mount", "-t", "ext4", upper, str(mnt))
            try:
                yield kdev(lower), kdev(upper), mnt
            finally:
                run("umount", str(mnt), check=False)
    finally:
        image.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            mnt.rmdir()


def test_files_of_a_filesystem_stacked_on_the_volume_are_hot(bpf_env: None) -> None:
    with stacked() as (volume, upper, mnt), Probe(max_files=1024) as p:
        path = mnt / f"stacked-{uuid.uuid4().hex[:6]}"
        path.write_bytes(os.urandom(1 << 20))
        os.sync()
        run("sh", "-c", "echo 3 > /proc/sys/vm/drop_caches")
        p.watch_volume(volume, fs_dev=upper)
        settle(p)
        ino = path.stat().st_ino
        child("import sys\nopen(sys.argv[1], 'rb').read()", str(path))
        collect(p, timeout=0.3)
        hot = [e for e in p.drain() if isinstance(e, HotnessDelta) and e.key.ino == ino]
        assert [e.key.dev for e in hot] == [upper] * len(hot) and hot
        assert sum(e.read_bytes for e in hot) == 1 << 20  # every byte of the cold read, at the volume
        if LAB_STACK_UPPER:  # device-mapper clones direct-I/O bios in the submitting task: its mark names the file
            assert any(n.startswith("on_dio_") or n.startswith("sys_dio_") for n in p.report.attached)
            child("import mmap, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)\n"
                  "for i in range(4): os.preadv(fd, [mmap.mmap(-1, 4096)], i * 4096)", str(path))
            hot = [e for e in p.drain() if isinstance(e, HotnessDelta) and e.key.ino == ino]
            assert sum(e.read_bytes for e in hot) == 4 * 4096


def test_a_device_below_two_volumes_counts_for_both(bpf_env: None) -> None:
    with contextlib.ExitStack() as stack:
        images = []
        for _ in range(3):
            image = IMG_DIR / f"cachepilot-shared-{uuid.uuid4().hex[:8]}.img"
            with open(image, "wb") as f:
                f.truncate(16 << 20)
            stack.callback(image.unlink, missing_ok=True)
            images.append(image)
        a, b, shared = (stack.enter_context(loop(str(i))) for i in images)
        p = stack.enter_context(Probe(max_files=64))
        va, vb, sd = kdev(a), kdev(b), kdev(shared)
        p.watch_volume(va, lower=[sd])
        p.watch_volume(vb, lower=[sd])
        settle(p)

        def discard(offset: int) -> list:
            run("blkdiscard", "--offset", str(offset), "--length", str(1 << 20), shared)
            return [e for e in collect(p, lambda evs: any(isinstance(e, Discard) for e in evs))
                    if isinstance(e, Discard) and e.dev == sd]

        assert sum(e.nr_sectors for e in discard(0)) == 2048
        sa, sb = p.volume_state(va), p.volume_state(vb)
        assert sa is not None and sb is not None and sa.discard_sectors == sb.discard_sectors == 2048
        p.unwatch(va)  # the other volume still sees the shared device
        assert sum(e.nr_sectors for e in discard(4 << 20)) == 2048
        sb = p.volume_state(vb)
        assert sb is not None and sb.discard_sectors == 4096
