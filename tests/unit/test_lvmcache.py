"""lvmcache on a fake host: an LVM cache LV is its own kind (found by its dm uuid), and every mode, policy and knob
change goes through lvchange on the LV (never a raw dmsetup reload), which refuses a mode change on a dirty cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from cachepilot.actions import Drain, SetKnob, SetWritePolicy
from cachepilot.backends import kinds, open_backend
from cachepilot.backends.base import DONE, FAILED, PENDING
from cachepilot.backends.dmcache import CacheTable
from cachepilot.backends.host import BlockDev, Host, ToolResult
from cachepilot.backends.inspect import sample_volume
from cachepilot.backends.lvmcache import LVM_BUSY, LvmCacheBackend, lv_of_dm_name
from cachepilot.daemon import volumes
from cachepilot.errors import DeviceGone, KernelRejected, RetryLater
from cachepilot.models.volume import VolumeInfo
from cachepilot.models.writeback import WritebackWatch

S = 1_000_000_000
DM_NAME = "lab--vg-cached"
TABLE = ("0 2097152 cache 254:5 254:4 254:6 128 2 metadata2 writeback smq 2 migration_threshold 2048")


class FakeLvm:
    """dmsetup (table, status) and lvchange as LVM and the kernel answer them: lvchange reloads the live table,
    refuses a mode change while blocks are dirty, and records every call."""

    def __init__(self) -> None:
        self.live = TABLE
        self.lvm_mode = "writeback"  # in LVM's metadata; the cleaner is loaded in writethrough (lvm2 2.03.16)
        self.dirty = 10
        self.threshold = "2048"
        self.calls: list[tuple[str, ...]] = []
        self.lvchange_stderr = ""  # a failure to answer with (exit status 5)

    def dm(self, args: Sequence[str], timeout: float) -> str:
        self.calls.append(("dmsetup", *args))
        if args[0] == "table":
            return self.live if len(args) > 1 else f"{DM_NAME}: {self.live}"
        assert args[0] == "status", args  # never a reload, suspend or message: LVM owns the table
        t = CacheTable.parse(self.live)
        return (f"0 2097152 cache 8 27/4096 128 100/3840 5 6 7 8 0 9 {self.dirty} {len(t.features)} "
                f"{' '.join(t.features)} 2 migration_threshold {self.threshold} {t.policy} 0 rw -")

    def tool(self, argv: Sequence[str], timeout: float) -> ToolResult:
        self.calls.append(tuple(argv))
        if argv[0] == "blkid":
            return ToolResult(2, "", "")
        if argv[0] == "lvs":
            return ToolResult(0, f"  {self.lvm_mode}  \n", "")
        assert argv[0] == "lvchange" and argv[-1] == "lab-vg/cached", argv
        if self.lvchange_stderr:
            return ToolResult(5, "", self.lvchange_stderr)
        opts = dict(zip(argv[1:-1:2], argv[2:-1:2], strict=True))
        t = CacheTable.parse(self.live)
        if opts.get("--cachemode", self.lvm_mode) != self.lvm_mode and self.dirty:
            return ToolResult(5, "", "  Cache lab-vg/cached is not clean, refusing to switch cache mode.\n")
        if "--cachesettings" in opts:
            self.threshold = opts["--cachesettings"].split("=")[1]
        self.lvm_mode = opts.get("--cachemode", self.lvm_mode)
        policy = opts.get("--cachepolicy", t.policy)
        self.live = t.with_(mode="writethrough" if policy == "cleaner" else self.lvm_mode, policy=policy).line()
        return ToolResult(0, "", "  WARNING: DM_DISABLE_UDEV environment variable set.\n")

    def lvchanges(self) -> list[tuple[str, ...]]:
        return [c[1:-1] for c in self.calls if c[0] == "lvchange"]


def lvm_tree(root: Path) -> None:
    d = root / "block" / "dm-7"
    (d / "dm").mkdir(parents=True)
    (d / "dm" / "name").write_text(DM_NAME + "\n")
    (d / "dm" / "uuid").write_text("LVM-0123abcdVGUUID4567LVUUID\n")
    (d / "dev").write_text("254:7\n")


@pytest.fixture
def lvm(tmp_path: Path) -> tuple[LvmCacheBackend, FakeLvm]:
    lvm_tree(tmp_path)
    fake = FakeLvm()
    b = open_backend(VolumeInfo(dev=7, name="dm-7", kind="lvmcache"), host=Host(sysfs=tmp_path, dm=fake.dm,
                                                                                 tool=fake.tool))
    assert isinstance(b, LvmCacheBackend)
    return b, fake


def test_an_lvm_cache_lv_is_its_own_kind_ahead_of_dm_cache(tmp_path: Path) -> None:
    table = tuple(TABLE.split())
    lvm_dev = BlockDev("dm-7", tmp_path, DM_NAME, "LVM-0123abcdVGUUID4567LVUUID", table)
    raw = BlockDev("dm-2", tmp_path, "lab-cached", "", table)
    assert kinds.detect(lvm_dev).name == "lvmcache"  # type: ignore[union-attr]
    assert kinds.detect(raw).name == "dm-cache"  # type: ignore[union-attr]
    assert kinds.detect(BlockDev("dm-8", tmp_path, "vg-lv", "LVM-x", ("0", "8", "linear"))) is None
    lvm_tree(tmp_path / "sys")
    fake = FakeLvm()
    found, problems = volumes.discover(Host(sysfs=tmp_path / "sys", proc=tmp_path, dm=fake.dm, tool=fake.tool))
    assert problems == [] and [(f.info.kind, f.label, f.info.cache_id) for f in found] == [
        ("lvmcache", DM_NAME, "254:4")]


@pytest.mark.parametrize(("dm_name", "lv"), [("vg-lv", "vg/lv"), ("lab--vg-cached", "lab-vg/cached"),
                                             ("a---b", "a-/b"), ("vg-my--lv", "vg/my-lv")])
def test_the_lv_of_a_dm_name(dm_name: str, lv: str) -> None:
    assert lv_of_dm_name(dm_name) == lv


@pytest.mark.parametrize("dm_name", ["plain", "-lv", "vg-", "only--dashes"])
def test_a_dm_name_lvm_did_not_make_is_refused(dm_name: str) -> None:
    with pytest.raises(KernelRejected, match="not a device-mapper name LVM made"):
        lv_of_dm_name(dm_name)


def test_drain_is_the_cleaner_by_lvchange_then_the_saved_policy(lvm: tuple[LvmCacheBackend, FakeLvm]) -> None:
    b, fake = lvm
    out = b.apply(Drain("dm-7", 10 * S, "age bound"))
    assert out.status == PENDING
    assert fake.lvchanges() == [("--cachepolicy", "cleaner")]  # alone: a mode change would wait for clean
    t = CacheTable.parse(fake.live)
    assert (t.mode, t.policy) == ("writethrough", "cleaner")  # as LVM loads it: no new dirty blocks
    assert b.step(1 * S) == []
    fake.dirty = 0
    [done] = b.step(2 * S)
    assert done.status == DONE, done.line()
    assert fake.lvchanges()[-1] == ("--cachemode", "writeback", "--cachepolicy", "smq") and fake.live == TABLE
    assert fake.lvm_mode == "writeback"


def test_a_cleaner_left_live_drains_back_to_the_mode_lvm_keeps(lvm: tuple[LvmCacheBackend, FakeLvm]) -> None:
    b, fake = lvm
    fake.live = CacheTable.parse(TABLE).with_(mode="writethrough", policy="cleaner").line()  # a daemon died
    fake.dirty = 0
    out = b.apply(Drain("dm-7", 10 * S, "age bound"))
    assert out.status == DONE, out.line()
    t = CacheTable.parse(fake.live)
    assert (t.mode, t.policy) == ("writeback", "smq") and fake.lvm_mode == "writeback"


def test_writethrough_switch_waits_for_clean_then_one_lvchange(lvm: tuple[LvmCacheBackend, FakeLvm]) -> None:
    b, fake = lvm
    out = b.apply(SetWritePolicy("dm-7", "writethrough", "destructive bound"))
    assert out.status == PENDING and fake.lvm_mode == "writeback"
    fake.dirty = 0
    [done] = b.step(1 * S)
    assert done.status == DONE and done.detail == "writethrough, clean", done.line()
    assert fake.lvchanges() == [("--cachepolicy", "cleaner"), ("--cachemode", "writethrough", "--cachepolicy", "smq")]
    t = CacheTable.parse(fake.live)
    assert (t.mode, t.policy) == ("writethrough", "smq") and fake.lvm_mode == "writethrough"


def test_passthrough_only_from_clean(lvm: tuple[LvmCacheBackend, FakeLvm]) -> None:
    b, fake = lvm
    fake.dirty = 0
    out = b.apply(SetWritePolicy("dm-7", "bypass", "cache failing"))
    assert out.status == DONE, out.line()
    assert fake.lvchanges() == [("--cachemode", "writethrough", "--cachepolicy", "smq"),
                                ("--cachemode", "passthrough", "--cachepolicy", "smq")]
    assert CacheTable.parse(fake.live).mode == "passthrough"


def test_migration_threshold_by_cachesettings_read_back_live(lvm: tuple[LvmCacheBackend, FakeLvm]) -> None:
    b, fake = lvm
    out = b.apply(SetKnob("dm-7", "migration_threshold", "4096", "policy"))
    assert out.status == DONE and out.writes[0].readback == "4096"
    assert fake.lvchanges() == [("--cachesettings", "migration_threshold=4096")]
    out = b.apply(SetKnob("dm-7", "writeback_percent", "10", "policy"))
    assert out.status == FAILED and "lvmcache has no knob 'writeback_percent'" in str(out.error)


def test_an_abandoned_drain_puts_the_policy_back_without_a_mode_change(lvm: tuple[LvmCacheBackend, FakeLvm]) -> None:
    b, fake = lvm
    b.apply(SetWritePolicy("dm-7", "writethrough", "x"))
    [out] = b.restore()  # still dirty: a mode change now would block inside lvchange
    assert out.status == FAILED
    assert fake.lvchanges()[-1] == ("--cachemode", "writeback", "--cachepolicy", "smq")  # LVM's mode, no wait
    assert fake.live == TABLE


@pytest.mark.parametrize(("stderr", "error"), [
    ("  Cache lab-vg/cached is not clean, refusing to switch cache mode.", RetryLater),
    ("  Failed to find logical volume \"lab-vg/cached\"", DeviceGone),
    ("  Invalid argument for --cachepolicy: mq2", KernelRejected),
])
def test_lvchange_failures_are_classified(lvm: tuple[LvmCacheBackend, FakeLvm], stderr: str,
                                          error: type[Exception]) -> None:
    b, fake = lvm
    fake.dirty = 0
    fake.lvchange_stderr = stderr
    out = b.apply(SetWritePolicy("dm-7", "writethrough", "x"))
    assert out.status == FAILED and type(out.error) is error, out.line()
    assert CacheTable.parse(fake.live).mode == "writeback"


def test_samples_are_the_kernels_view(lvm: tuple[LvmCacheBackend, FakeLvm]) -> None:
    b, fake = lvm
    s = b.sample(5)
    assert (s.mode, s.dirty_bytes, s.cache_id, s.knobs["migration_threshold"]) == ("writeback", 10 * 128 * 512,
                                                                                    "254:4", "2048")


def test_a_stall_under_writes_is_explained_as_lvmcache_with_lvms_cleaner(lvm: tuple[LvmCacheBackend, FakeLvm]) -> None:
    """The daemon's samples (the backend's) and inspect's (the kind's) both: the cause names lvmcache and LVM's
    cleaner, not dm-cache's table policy (a raw reload to the cleaner would be undone by LVM's next activation)."""
    b, _ = lvm
    views = [b.sample(5).writeback, sample_volume(b.info, host=b.host, now_ns=5).writeback]
    assert [v.busy_hold if v else None for v in views] == [LVM_BUSY, LVM_BUSY]
    assert views[0] is not None
    w, out = WritebackWatch(), []
    for i in range(6):  # dirty data that does not fall while writes keep the origin busy
        out += w.observe("dm-7", i * 5 * S, 10 * 128 * 512, replace(views[0], writes=100 + i), False, 20, 0)
    [f] = out
    assert "writes kept coming" in f.why and "lvmcache's smq (dm-cache under LVM)" in f.why
    assert "LVM's cleaner policy by lvchange" in f.why and "dm-cache's smq" not in f.why
