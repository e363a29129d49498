"""Adopting and dropping volumes (daemon/adoption.py, daemon/volumes.py): vanished, gone while sampling, remounted,
a filesystem stacked on a cached device, and the volumes found but not managed (issue 24)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from cachepilot.actions import Drain
from cachepilot.commands.status import render
from cachepilot.daemon.volumes import Found
from cachepilot.errors import KernelRejected
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo
from tests.unit.daemon_rig import (
    DEV,
    VOL,
    FakeBackend,
    Rig,
    metrics,
    write,
)


def test_vanished_volume_is_dropped_and_its_pending_actions_cancelled(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.d.start()
    b = rig.backends["bcache0"]
    rig.d.execute(Drain("bcache0", 0, "test"), rig.d.started_ns)
    assert rig.d.vols[DEV].in_flight and b.knobs["writeback_percent"] == "0"
    rig.found = []
    rig.tick(2)  # rescan: gone
    assert DEV not in rig.d.vols and DEV not in rig.d.engine.vols and b.restored == 1
    assert [r.message for r in caplog.records if "dropped" in r.message] == [
        "dropped bcache0: vanished; 1 pending action(s) cancelled"]
    rig.found = [Found(VOL)]
    rig.tick(4)
    assert DEV in rig.d.vols  # it came back: adopted again
    assert rig.d.vols[DEV].ctl is rig.d.engine.vols[DEV]  # one handle: the engine's state of it is the new one
    moved = VolumeInfo(dev=DEV, name="bcache0", kind="bcache", fs_uuid="u-1", mountpoint="/mnt/y", cache_bytes=1 << 30)
    rig.found = [Found(moved)]
    rig.tick(6)
    assert rig.d.vols[DEV].info.mountpoint == "/mnt/y"  # remounted elsewhere: dropped and adopted as it is now
    ctl = rig.d.vols[DEV].ctl
    assert ctl is rig.d.engine.vols[DEV] and ctl.info.mountpoint == "/mnt/y"
    assert any("dropped bcache0: changed (now bcache, mounted at '/mnt/y')" in r.message for r in caplog.records)


def test_device_gone_while_sampling_drops_the_volume(rig: Rig) -> None:
    rig.d.start()
    rig.backends["bcache0"].gone = True
    rig.tick(0.5)
    assert DEV not in rig.d.vols and rig.d.counters["volumes.dropped"] == 1


def test_a_filesystem_stacked_on_a_cached_device_is_found(tmp_path: Path) -> None:
    from cachepilot.backends.host import Host, ToolResult
    from cachepilot.daemon import volumes

    sysb = tmp_path / "block"
    for name, dev in (("bcache0", "252:0"), ("dm-3", "253:3"), ("dm-4", "253:4")):
        (sysb / name / "holders").mkdir(parents=True)
        (sysb / name / "dev").write_text(dev + "\n")
    (sysb / "bcache0" / "holders" / "dm-3").symlink_to(sysb / "dm-3")  # LVM PV on bcache0 ...
    (sysb / "dm-3" / "holders" / "dm-4").symlink_to(sysb / "dm-4")  # ... an LV on it, mounted
    mountinfo = tmp_path / "proc" / "self" / "mountinfo"
    mountinfo.parent.mkdir(parents=True)
    mountinfo.write_text("22 1 254:1 / / rw - ext4 /dev/vda1 rw\n40 22 253:4 / /srv rw - ext4 /dev/dm-4 rw\n")

    def blkid(argv: Sequence[str], timeout: float) -> ToolResult:
        return ToolResult(0, "uuid-of-" + argv[-1].rsplit("/", 1)[1] + "\n", "")

    host = Host(sysfs=tmp_path, proc=tmp_path / "proc", tool=blkid, statvfs=lambda p: os.statvfs("/"))
    bare = VolumeInfo(dev=kdev(252, 0), name="bcache0", kind="bcache", cache_bytes=1 << 30)
    info, block_dev = volumes._fs_on_stack(host, "bcache0", bare)
    assert block_dev == kdev(252, 0) and info.dev == kdev(253, 4) and info.name == "bcache0"
    assert (info.mountpoint, info.fs_uuid, info.kind) == ("/srv", "uuid-of-dm-4", "bcache")
    assert volumes.Found(info, (), block_dev).volume_dev == kdev(252, 0)
    mounted = VolumeInfo(dev=kdev(252, 0), name="bcache0", mountpoint="/mnt")
    assert volumes._fs_on_stack(host, "bcache0", mounted) == (mounted, None)  # mounted directly: as it is
    mountinfo.write_text("22 1 254:1 / / rw - ext4 /dev/vda1 rw\n")
    assert volumes._fs_on_stack(host, "bcache0", bare) == (bare, None)  # nothing mounted anywhere


TWO_RULES = """
version: 1
volumes:
  - {name: by-device, match: {device: bcache0}}
  - {name: by-mount, match: {mountpoint: /mnt/x}}
"""


ONE_RULE = "version: 1\nvolumes:\n  - {name: by-device, match: {device: bcache0}}\n"


def unmanaged_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("cachepilot_volume_unmanaged{")]


def test_a_volume_two_rules_select_is_unmanaged_until_the_policy_is_fixed(tmp_path: Path) -> None:
    r = Rig(tmp_path, policy=TWO_RULES, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.d.start()
    r.tick(1)
    assert r.d.vols == {}
    assert unmanaged_lines(metrics(r)) == [
        'cachepilot_volume_unmanaged{device="bcache0",reason="policy",volume="bcache0"} 1.0']
    status = r.status()
    assert status["unmanaged"] == [{"name": "bcache0", "dev": "bcache0", "reason": "policy"}]
    assert "bcache0    NOT MANAGED (policy; bcache0)" in render(status)  # `cachepilot status`
    write(r.tmp / "p.yaml", ONE_RULE)
    r.d.request_reload()
    r.tick(3)  # the reload, then the next rescan (1 s) adopts it
    assert DEV in r.d.vols
    assert unmanaged_lines(metrics(r)) == []
    r.d.shutdown()


def test_a_volume_whose_backend_will_not_open_is_unmanaged(tmp_path: Path) -> None:
    def factory(info: VolumeInfo) -> FakeBackend:
        if info.name == "bcache1":
            raise KernelRejected("bcache1: no cache_mode")
        return r.backend(info)

    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}", backend_factory=factory)
    other = VolumeInfo(dev=kdev(252, 1), name="bcache1", kind="bcache", mountpoint="/mnt/z", cache_bytes=1 << 30)
    r.found = [Found(VOL), Found(other)]
    r.d.start()
    r.tick(1)
    assert unmanaged_lines(metrics(r)) == [
        'cachepilot_volume_unmanaged{device="bcache1",reason="backend",volume="bcache1"} 1.0']
    r.found = [Found(VOL)]  # it went away: no longer unmanaged either
    r.tick(3)
    assert unmanaged_lines(metrics(r)) == []
    r.d.shutdown()


@pytest.mark.parametrize("problem", ["bcache2: cannot describe: no dev", "/sys/block: Permission denied"])
def test_a_device_discover_could_not_describe_is_unmanaged_unless_it_has_no_usable_name(
        tmp_path: Path, problem: str) -> None:
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.problems = [problem]
    r.d.start()
    r.tick(1)
    want = ['cachepilot_volume_unmanaged{device="bcache2",reason="describe",volume="bcache2"} 1.0'] \
        if problem.startswith("bcache2") else []
    assert unmanaged_lines(metrics(r)) == want
    r.d.shutdown()
