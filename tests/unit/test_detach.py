"""`cachepilot detach` / `attach` (issue 36 item 2): the per-kind sequences on fixture sysfs trees and a fake dmsetup
(bcache ``detach`` polled to "no cache", dm kinds a linear table over the origin, the table replaced kept, lvmcache
``lvconvert --splitcache``), the engine's drain-then-detach, the refusal line of a failed cache holding dirty data,
the daemon releasing a detached volume (not latched, listed as detached) and adopting it again after attach, and the
command line."""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from cachepilot import cli
from cachepilot.actions import DONE, FAILED, PENDING, Detach, Drain, Outcome, SetWritePolicy, Write
from cachepilot.backends import kinds, open_backend, uncache
from cachepilot.backends.base import ControlAction
from cachepilot.backends.bcache import BcacheBackend
from cachepilot.backends.host import Host, ToolResult
from cachepilot.backends.lvmcache import LvmCacheBackend
from cachepilot.daemon.volumes import Found
from cachepilot.engine import Engine
from cachepilot.errors import KernelRejected, UserError
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy
from tests.unit.daemon_rig import VOL, FakeBackend, Rig, metrics
from tests.unit.test_backends import CACHE_TABLE, WC_TABLE, FakeDm, bcache_tree, dm_tree, wc_backend

S = NS = 1_000_000_000
MIB = 1 << 20
CSET = "0f3b2a9e-5c1d-4e8f-9a7b-123456789abc"


# ------------------------------------------------------------------ bcache: detach polled to "no cache", attach
def fake_bcache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[tuple[str, str]]]:
    """A bcache0 tree whose ``detach`` the fake kernel takes as bcache does: the write returns at once, the set is
    unlinked (``state`` "no cache") only once the write-back thread has written back what was dirty; ``attach``
    links the set named (ENOENT for another)."""
    d = bcache_tree(tmp_path, dirty="4.0M", state="dirty")
    for f in ("detach", "attach"):  # write-only in sysfs
        (d / f).write_text("")
    import cachepilot.backends.bcache as mod

    real = mod.write_attr
    written: list[tuple[str, str]] = []

    def write(path: Path, value: str) -> None:
        written.append((path.name, value))
        if path.name == "attach":
            if value != CSET:
                raise KernelRejected(f"{path}: write failed: No such file or directory")
            (d / "cache").symlink_to(tmp_path / "fs" / "bcache" / CSET)
            (d / "state").write_text("clean\n")
            return
        real(path, value)

    monkeypatch.setattr(mod, "write_attr", write)
    return d, written


@pytest.fixture
def bcd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    d, written = fake_bcache(tmp_path, monkeypatch)
    b = open_backend(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path))
    assert isinstance(b, BcacheBackend)
    return b, d, written


def kernel_finishes_detach(d: Path) -> None:
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("no cache\n")
    (d / "cache").unlink()


def test_bcache_detach_writes_detach_then_waits_for_no_cache(bcd) -> None:  # type: ignore[no-untyped-def]
    b, d, written = bcd
    out = b.apply(Detach("bcache0", 60 * S, "operator detach"))
    assert out.status == PENDING and ("detach", "1") in written
    assert out.writes[0].target == "bcache0 detach" and out.writes[0].before == "dirty"
    assert "4194304 dirty bytes" in out.detail  # the kernel writes back what is dirty before it unlinks the set
    assert b.step(1 * S) == []  # still "dirty": not done
    kernel_finishes_detach(d)
    [done] = b.step(2 * S)
    assert done.status == DONE and done.writes[-1].readback == "no cache"
    assert "backing device serves alone" in done.detail


def test_bcache_detach_that_never_reads_no_cache_fails_at_its_deadline(bcd) -> None:  # type: ignore[no-untyped-def]
    b, _d, _ = bcd
    assert b.apply(Detach("bcache0", 5 * S, "operator detach")).status == PENDING
    [out] = b.step(6 * S)
    assert out.status == FAILED and "missed its deadline" in str(out.error)


def test_bcache_attach_writes_the_cache_set_and_reads_the_link_back(bcd) -> None:  # type: ignore[no-untyped-def]
    b, d, written = bcd
    kernel_finishes_detach(d)
    how = kinds.kind("bcache").reattach
    assert how is not None and how.valid(CSET) and not how.valid("../../etc")
    w = how.attach(b.host, "bcache0", "", CSET)
    assert w == Write("bcache0 attach", "no cache", CSET, CSET) and ("attach", CSET) in written
    with pytest.raises(KernelRejected):
        how.attach(b.host, "bcache0", "", "00000000-0000-0000-0000-000000000000")


# ------------------------------------------------------------------ dm kinds: a linear table over the origin
def test_writecache_detach_flushes_on_suspend_and_loads_linear_over_the_origin(tmp_path: Path) -> None:
    fake = FakeDm(WC_TABLE)
    b = wc_backend(tmp_path, fake)
    out = b.apply(Detach("dm-2", 60 * S, "operator detach"))
    assert out.status == DONE, out
    linear = "0 2097152 linear 253:0 0"
    assert fake.live == linear and ("suspend", "lab-cached") in fake.calls  # a healthy cache: the fs frozen first
    verbs = [c[0] if c[0] != "message" else f"message {c[3]}" for c in fake.calls if c[0] != "status"]
    # flush_on_suspend before the suspend that loads the linear table: the suspend writes every dirty block back
    assert verbs.index("message flush_on_suspend") < verbs.index("reload") < verbs.index("suspend") \
        < verbs.index("resume")
    table = next(w for w in out.writes if w.target == "lab-cached table")
    assert (table.before, table.value, table.readback) == (WC_TABLE, linear, linear)
    assert uncache.saved_table("", out.writes) == WC_TABLE


def test_writecache_with_an_error_is_refused_without_accept_loss(tmp_path: Path) -> None:
    class Failed(FakeDm):
        def __call__(self, args: Sequence[str], timeout: float) -> str:
            got = super().__call__(args, timeout)
            return "0 2097152 writecache 1 1000 900 0" if args[0] == "status" and "writecache" in self.live \
                else got

    fake = Failed(WC_TABLE)
    b = wc_backend(tmp_path, fake)
    out = b.apply(Detach("dm-2", 60 * S, "operator detach"))
    assert out.status == FAILED and "refused without accept_loss" in str(out.error) and fake.live == WC_TABLE
    out = b.apply(Detach("dm-2", 60 * S, "operator detach", accept_loss=True))
    assert out.status == DONE and fake.live.split()[2] == "linear"
    assert not [c for c in fake.calls if c[:1] == ("message",)]  # no flush asked of a failed cache
    # nor a filesystem freeze: its journal flush fails on the failed cache, and the suspend with it (lab, 6.1)
    assert ("suspend", "--nolockfs", "lab-cached") in fake.calls and ("suspend", "lab-cached") not in fake.calls


def test_dmcache_detach_only_from_clean(tmp_path: Path) -> None:
    dm_tree(tmp_path)
    fake = FakeDm(CACHE_TABLE, dirty=3)
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind="dm-cache"), host=Host(sysfs=tmp_path, dm=fake))
    out = b.apply(Detach("dm-2", 60 * S, "operator detach"))
    assert out.status == FAILED and "3 dirty blocks: drain first" in str(out.error) and fake.live == CACHE_TABLE
    fake.dirty = 0
    out = b.apply(Detach("dm-2", 60 * S, "operator detach"))
    assert out.status == DONE and fake.live == "0 2097152 linear 253:0 0"  # the origin is the third device
    assert uncache.saved_table("", out.writes) == CACHE_TABLE


def test_dm_attach_loads_the_saved_table_again(tmp_path: Path) -> None:
    fake = FakeDm("0 2097152 linear 253:0 0")
    how = kinds.kind("dm-writecache").reattach
    assert how is not None and how.valid(WC_TABLE) and not how.valid(CACHE_TABLE)
    w = how.attach(Host(sysfs=tmp_path, dm=fake), "dm-2", "lab-cached", WC_TABLE)
    assert fake.live == WC_TABLE and w.before == "0 2097152 linear 253:0 0" and w.readback == WC_TABLE


def test_a_table_that_does_not_read_back_is_rejected_and_the_old_one_kept(tmp_path: Path) -> None:
    fake = FakeDm(WC_TABLE)
    fake.fail["suspend"] = "device-mapper: suspend ioctl on lab-cached failed: Device or resource busy"
    b = wc_backend(tmp_path, fake)
    out = b.apply(Detach("dm-2", 60 * S, "operator detach"))
    assert out.status == FAILED and fake.live == WC_TABLE and ("clear", "lab-cached") in fake.calls


# ------------------------------------------------------------------ lvmcache: lvconvert --splitcache
class FakeLvconvert:
    """lvm2 2.03.16 as the lab showed it: a cache pool ``fast`` attached reads ``[fast_cpool]`` in pool_lv; after
    --splitcache the LV is linear and the pool is ``fast`` again (``fast_cpool`` no longer exists)."""

    def __init__(self) -> None:
        self.cached = True
        self.calls: list[tuple[str, ...]] = []

    def dm(self, args: Sequence[str], timeout: float) -> str:
        return "0 2097152 cache 254:5 254:4 254:6 128 1 writeback smq 0"

    def tool(self, argv: Sequence[str], timeout: float) -> ToolResult:
        self.calls.append(tuple(argv))
        if argv[0] == "lvs":
            field, lv = argv[3], argv[4]
            if lv != "lab-vg/cached":  # the pool: named NAME_cpool while attached, NAME once split off
                exists = lv == ("lab-vg/fast_cpool" if self.cached else "lab-vg/fast")
                return (ToolResult(0, "  cache-pool\n", "") if exists else
                        ToolResult(5, "", f'  Failed to find logical volume "{lv}"\n'))
            if field == "pool_lv":
                return ToolResult(0, "  [fast_cpool]\n" if self.cached else "  \n", "")
            return ToolResult(0, "  cache\n" if self.cached else "  linear\n", "")
        if argv[:3] == ("lvconvert", "--yes", "--splitcache"):
            self.cached = False
            return ToolResult(0, "", "")
        if argv[:4] == ("lvconvert", "--yes", "--type", "cache"):
            if argv[5] != "lab-vg/fast":
                return ToolResult(5, "", f'  Failed to find logical volume "{argv[5]}"\n')
            self.cached = True
            return ToolResult(0, "", "")
        raise AssertionError(argv)


def test_lvmcache_detach_is_lvconvert_splitcache_and_attach_puts_the_pool_back(tmp_path: Path) -> None:
    dm_tree(tmp_path, "lab--vg-cached")
    fake = FakeLvconvert()
    host = Host(sysfs=tmp_path, dm=fake.dm, tool=fake.tool)
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind="lvmcache"), host=host)
    assert isinstance(b, LvmCacheBackend)
    out = b.apply(Detach("dm-2", 60 * S, "operator detach"))
    assert out.status == DONE, out
    assert ("lvconvert", "--yes", "--splitcache", "lab-vg/cached") in fake.calls  # an argv list, no shell
    how = kinds.kind("lvmcache").reattach
    assert how is not None
    pool = how.saved("", out.writes)
    # the name the split pool has (lvm2 drops the _cpool it added on attach), read back with lvs
    assert pool == "lab-vg/fast" and how.valid(pool) and not how.valid("a;b/c")
    assert ("lvs", "--noheadings", "-o", "segtype", "lab-vg/fast") in fake.calls
    w = how.attach(host, "dm-2", "lab--vg-cached", pool)
    assert fake.calls[-2] == ("lvconvert", "--yes", "--type", "cache", "--cachepool", pool, "lab-vg/cached")
    assert w.readback == "segtype cache"
    out = b.apply(Detach("dm-2", 60 * S, "operator detach", accept_loss=True))
    assert out.status == FAILED and "--uncache --force" in str(out.error)  # said, not done


def test_lvmcache_pool_names_kept_by_a_split() -> None:
    from cachepilot.backends.lvmcache import kept_pool_name

    assert kept_pool_name("cpool_cpool") == "cpool" and kept_pool_name("fast") == "fast"
    assert kept_pool_name("_cpool") == "_cpool"


# ------------------------------------------------------------------ the engine: drain, verify, then detach
DEV = kdev(252, 0)
POLICY = "version: 1\ndefaults: {failure_model: destructive, exposure: {max_dirty: 8MiB, max_age: 30s}}\n"


def engine(kind: str = "bcache") -> Engine:
    return Engine(parse_policy(POLICY, "t.yaml"), [VolumeInfo(dev=DEV, name="bcache0", kind=kind,
                                                             cache_bytes=1 << 30)])


def tick(e: Engine, t: float, mode: str = "writeback", dirty: int = 0, failed: bool = False) -> list:  # type: ignore[type-arg]
    e.sample(VolumeSample(DEV, int(t * NS), mode, dirty, 0, 0, 0, failed, {}, ""))
    return e.tick(int(t * NS))


def test_the_engine_drains_to_clean_write_through_then_detaches_once() -> None:
    e = engine()
    tick(e, 1, dirty=4 * MIB)
    e.operator_detach("bcache0", 60, accept_loss=False)
    acts = tick(e, 2, dirty=4 * MIB)
    op = e.vols[DEV].operator
    assert op is not None and op.state == "running" and isinstance(op.action, Drain)  # the operator's drain
    d = op.action
    assert not [a for a in acts if isinstance(a, Detach)]  # not before the drain read the cache clean
    e.outcome(Outcome(d, DONE, detail="clean"))
    acts = tick(e, 3, dirty=0)  # held: the switch to write-through first (no new dirty data before the detach)
    assert [a.mode for a in acts if isinstance(a, SetWritePolicy)] == ["writethrough"]
    assert not [a for a in acts if isinstance(a, Detach)]
    [det] = [a for a in tick(e, 4, mode="writethrough", dirty=0) if isinstance(a, Detach)]
    assert det.reason.startswith("operator detach") and not det.accept_loss
    assert not [a for a in tick(e, 5, mode="writethrough") if isinstance(a, Detach)]  # once
    assert e.detached() == []
    e.outcome(Outcome(det, DONE, writes=(Write("bcache0 detach", "clean", "1", "no cache"),), detail="no cache"))
    [c] = e.detached()
    assert c.detach is not None and c.detach.writes[0].readback == "no cache"


def test_a_detachs_deadline_runs_from_the_time_the_request_is_taken_up_not_from_a_late_last_tick() -> None:
    """As an operator's drain's (test_operator_drain): the engine's clock is the last tick's until the next."""
    e = engine()
    tick(e, 1, dirty=0)
    status = e.operator_detach("bcache0", 2, False, now_ns=6 * NS)  # the last tick was 5 s ago
    assert status["deadline_in_s"] == 2
    [d] = [a for a in tick(e, 6, dirty=4 * MIB) if isinstance(a, Drain)]  # its drain, not an expired one
    assert d.deadline_ns == 8 * NS and e.vols[DEV].detach is not None and e.vols[DEV].detach.state == "draining"


def test_an_expired_drain_fails_the_detach_and_nothing_is_detached() -> None:
    e = engine()
    tick(e, 1, dirty=4 * MIB)
    e.operator_detach("bcache0", 3, accept_loss=False)
    for t in range(2, 7):
        acts = tick(e, t, dirty=4 * MIB)
        assert not [a for a in acts if isinstance(a, Detach)]
    c = e.vols[DEV]
    assert c.detach is not None and c.detach.state == "failed" and "drain expired" in c.detach.detail


def test_a_failed_detach_says_the_kernels_error_and_the_volume_stays_managed() -> None:
    e = engine()
    tick(e, 1, dirty=MIB)
    e.operator_detach("bcache0", 60, accept_loss=False)
    tick(e, 2, dirty=MIB)
    d = e.vols[DEV].operator.action  # type: ignore[union-attr]
    assert isinstance(d, Drain)
    e.outcome(Outcome(d, DONE, detail="clean"))
    [det] = [a for t in (3, 4) for a in tick(e, t, mode="writethrough") if isinstance(a, Detach)]
    e.outcome(Outcome(det, FAILED, error=KernelRejected("bcache0: detach missed its deadline in phase detaching"),
                      detail="failed in phase detaching"))
    c = e.vols[DEV]
    assert c.detach is not None and c.detach.state == "failed" and e.detached() == []
    assert "missed its deadline" in c.detach.detail and "phase detaching" in c.detach.detail


def test_a_failed_cache_holding_dirty_data_is_refused_with_one_line_naming_the_bytes() -> None:
    e = engine()
    tick(e, 1, dirty=3 * MIB, failed=True)
    with pytest.raises(UserError) as exc:
        e.operator_detach("bcache0", 60, accept_loss=False)
    assert str(exc.value) == (f"bcache0: refused: the cache device failed holding {3 * MIB} dirty bytes that a"
                              " detach would lose (--accept-loss detaches anyway)")
    e.operator_detach("bcache0", 60, accept_loss=True)
    [det] = [a for a in tick(e, 2, dirty=3 * MIB, failed=True) if isinstance(a, Detach)]  # no drain: it cannot
    assert det.accept_loss


def test_a_failed_dm_cache_reports_no_figures_so_the_refusal_names_what_it_held_before() -> None:
    """dm-cache's status is "Fail" (or "Error" on 6.1) once its cache device failed: no dirty count. The loss a
    detach would cause is the last reading before the failure (lab: 10 MiB dirty, then "Error")."""
    e = engine("dm-cache")
    tick(e, 1, dirty=10 * MIB)
    tick(e, 2, dirty=0, failed=True)  # the failed status: no figures
    with pytest.raises(UserError, match=f"failed holding {10 * MIB} dirty bytes"):
        e.operator_detach("bcache0", 60, accept_loss=False)


def test_a_failed_dm_cache_stays_managed_and_detaches_only_with_accept_loss(tmp_path: Path) -> None:
    """The backend says a failed dm-cache is rejected, not gone (gone drops the volume: no latch, no alert, no
    detach); with accept_loss the linear table goes in without a filesystem freeze."""
    class Failed(FakeDm):
        def __call__(self, args: Sequence[str], timeout: float) -> str:
            got = super().__call__(args, timeout)
            return "0 2097152 cache Error" if args[0] == "status" and " cache " in self.live else got

    dm_tree(tmp_path)
    fake = Failed(CACHE_TABLE)
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind="dm-cache"), host=Host(sysfs=tmp_path, dm=fake))
    out = b.apply(Drain("dm-2", 60 * S, "health"))
    assert out.status == FAILED and isinstance(out.error, KernelRejected) and "reports Fail" in str(out.error)
    out = b.apply(Detach("dm-2", 60 * S, "operator detach"))
    assert out.status == FAILED and fake.live == CACHE_TABLE
    out = b.apply(Detach("dm-2", 60 * S, "operator detach", accept_loss=True))
    assert out.status == DONE and fake.live == "0 2097152 linear 253:0 0", out
    assert ("suspend", "--nolockfs", "lab-cached") in fake.calls and ("suspend", "lab-cached") not in fake.calls


def test_writecache_has_no_write_through_the_detach_follows_the_drain_directly() -> None:
    e = engine("dm-writecache")
    tick(e, 1, dirty=4 * MIB)
    e.operator_detach("bcache0", 60, accept_loss=False)
    tick(e, 2, dirty=4 * MIB)
    d = e.vols[DEV].operator.action  # type: ignore[union-attr]
    assert isinstance(d, Drain)
    e.outcome(Outcome(d, DONE, detail="flushed"))
    assert [a for a in tick(e, 3, dirty=0) if isinstance(a, Detach)]


# ------------------------------------------------------------------ the daemon: release, status, attach, adopt
class DetachingBackend(FakeBackend):
    """The rig's in-memory cache, which also takes a Detach (done at once: it has nothing dirty)."""

    def apply(self, action: ControlAction, *, dry_run: bool = False) -> Outcome:
        if isinstance(action, Detach):
            self.applied.append((action, dry_run))
            self.detached = True
            return Outcome(action, DONE, writes=(Write("bcache0 detach", "clean", "1", "no cache"),),
                           detail="no cache")
        return super().apply(action, dry_run=dry_run)


@pytest.fixture
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    backends: dict[str, DetachingBackend] = {}

    def factory(info: VolumeInfo) -> DetachingBackend:
        return backends.setdefault(info.name, DetachingBackend(info))

    r = Rig(tmp_path, backend_factory=factory, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.backends = backends  # type: ignore[assignment]
    yield r
    r.d.shutdown()


def run_detach(rig: Rig) -> None:
    """Through the control socket's answer and the loop's ticks: drain (done), write-through, detach."""
    b = rig.backends["bcache0"]
    answer = rig.d.answer({"cmd": "detach", "volume": "bcache0", "deadline": 60})
    assert answer == {"queued": "bcache0", "dirty_bytes": 0, "request": answer["request"]}
    rig.tick(2)
    drains = [a for a, _ in b.applied if isinstance(a, Drain)]
    rig.d.engine.outcome(Outcome(drains[-1], DONE, detail="clean"))
    rig.tick(3)  # the hold's switch to write-through (the fake backend does it at once)
    assert b.mode == "writethrough"
    rig.tick(4)  # the detach, then its release at the end of the tick


def test_the_daemon_releases_a_detached_volume_and_lists_it_with_its_cache(rig: Rig) -> None:
    rig.d.start()
    rig.tick(1)
    run_detach(rig)
    s = rig.status()
    assert [v["name"] for v in s["volumes"]] == []  # not managed: no latch, no alert
    [d] = s["detached"]
    assert (d["name"], d["kind"], d["why"], d["cache"]) == ("bcache0", "bcache", "detached", VOL.cache_id)
    assert rig.d.engine.latched() == {}
    assert any(x["action"].startswith("detach bcache0") and x["status"] == "done"
               for x in rig.d.answer({"cmd": "explain"})["decisions"])
    # the device now has no cache: discovery finds it so, and it stays out of management at the next rescans
    rig.found = [Found(VolumeInfo(dev=VOL.dev, name="bcache0", kind="bcache", mountpoint="/mnt/x"))]
    rig.tick(10)
    assert rig.status()["volumes"] == [] and rig.status()["detached"][0]["name"] == "bcache0"
    # and as a metric (no alert: detach is deliberate), not as unmanaged
    assert detached_lines(metrics(rig)) == [
        'cachepilot_volume_detached{device="bcache0",kind="bcache",reason="operator",volume="bcache0"} 1.0']
    assert "cachepilot_volume_unmanaged{" not in metrics(rig)


def detached_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("cachepilot_volume_detached{")]


def test_a_bcache_device_found_without_a_cache_is_not_managed_but_one_that_loses_it_is_kept(rig: Rig) -> None:
    rig.found = [Found(VolumeInfo(dev=VOL.dev, name="bcache0", kind="bcache", mountpoint="/mnt/x"))]
    rig.d.start()
    rig.tick(1)
    s = rig.status()
    assert s["volumes"] == [] and s["unmanaged"] == []
    assert [(d["name"], d["why"]) for d in s["detached"]] == [("bcache0", "no cache")]
    assert detached_lines(metrics(rig)) == [
        'cachepilot_volume_detached{device="bcache0",kind="bcache",reason="no_cache",volume="bcache0"} 1.0']
    # a managed volume whose cache set goes away (a failed cache device bcache unregistered) stays managed: its
    # failure is latched and alerted on, as before
    rig.found = [Found(VOL)]
    rig.tick(12)
    assert [v["name"] for v in rig.status()["volumes"]] == ["bcache0"]
    rig.found = [Found(VolumeInfo(dev=VOL.dev, name="bcache0", kind="bcache", mountpoint="/mnt/x"))]
    rig.tick(24)
    assert [v["name"] for v in rig.status()["volumes"]] == ["bcache0"] and rig.status()["detached"] == []


def test_a_managed_volume_whose_cache_now_reads_0_bytes_stays_the_same_volume(rig: Rig) -> None:
    """A failed dm-cache reports "Fail" with no figures, so describe reads a 0-byte cache: the volume is kept as it
    was (its samples: what it held before it failed), not dropped as changed and adopted afresh (lab run 8: the
    refusal then named 0 dirty bytes)."""
    rig.d.start()
    rig.tick(1)
    ctl = rig.d.engine.vols[VOL.dev]
    rig.found = [Found(dataclasses.replace(VOL, cache_bytes=0))]
    rig.tick(12)
    assert rig.d.engine.vols[VOL.dev] is ctl and [v["name"] for v in rig.status()["volumes"]] == ["bcache0"]
    rig.found = [Found(dataclasses.replace(VOL, cache_bytes=0, mountpoint="/mnt/y"))]  # anything else: changed
    rig.tick(24)
    assert rig.d.engine.vols[VOL.dev] is not ctl


def test_attach_goes_through_the_kind_is_logged_and_the_volume_is_adopted_again(rig: Rig, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rig.d.start()
    rig.tick(1)
    run_detach(rig)
    rig.found = [Found(VolumeInfo(dev=VOL.dev, name="bcache0", kind="bcache", mountpoint="/mnt/x"))]
    rig.tick(5)
    sysfs = rig.tmp / "sys"
    d, written = fake_bcache(sysfs, monkeypatch)  # the kernel's side: a bcache0 with no cache set
    kernel_finishes_detach(d)
    rig.d.lifecycle.host = lambda: Host(sysfs=sysfs)
    with pytest.raises(UserError, match="is not a detached device"):
        rig.d.answer({"cmd": "attach", "volume": "nope"})
    with pytest.raises(UserError, match="cache set's UUID"):
        rig.d.answer({"cmd": "attach", "volume": "bcache0", "cache": "/etc/passwd"})
    assert rig.d.answer({"cmd": "attach", "volume": "bcache0", "cache": "00000000-0000-0000-0000-000000000000"})
    rig.tick(6)  # a set the kernel does not know: failed, said, still detached
    [det] = rig.status()["detached"]
    assert "No such file or directory" in det["attach_error"]
    assert rig.d.answer({"cmd": "attach", "volume": "bcache0", "cache": CSET})["queued"] == "bcache0"
    rig.found = [Found(VOL)]  # what discovery reads once the kernel shows the cache again
    rig.tick(7)
    assert ("attach", CSET) in written and (d / "cache").resolve().name == CSET
    s = rig.status()
    assert [v["name"] for v in s["volumes"]] == ["bcache0"] and s["detached"] == []
    assert detached_lines(metrics(rig)) == []  # attached: the series goes away
    assert any(x["action"] == f"attach bcache0 cache={CSET}: operator attach (cachepilot attach)"
               and x["status"] == "done" for x in rig.d.answer({"cmd": "explain"})["decisions"])


def test_a_refused_detach_is_one_line_and_exit_2_on_the_command_line(rig: Rig, capsys) -> None:  # type: ignore[no-untyped-def]
    rig.d.start()
    b = rig.backends["bcache0"]
    b.dirty = 5 * MIB
    real = b.sample
    b.sample = lambda now: dataclasses.replace(real(now), failed=True)  # type: ignore[method-assign]
    rig.tick(1)
    rc = cli.main(["detach", "--socket", str(rig.d.config.socket), "bcache0", "--deadline", "2s"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["cachepilot: daemon: bad request: bcache0: refused: the cache device failed holding"
                               f" {5 * MIB} dirty bytes that a detach would lose (--accept-loss detaches anyway)"]
    assert rig.d.lifecycle.detach_requests == []


def test_a_failed_cache_that_reports_no_figures_is_refused_at_the_socket_with_what_it_held(rig: Rig, capsys) -> None:  # type: ignore[no-untyped-def]
    """dm-cache's "Fail" has no dirty count: the socket's refusal names the bytes read before the failure (lab run
    10: the loop refused it, but only in its log, after the CLI had been told "detach queued (0 B dirty)")."""
    rig.d.start()
    b = rig.backends["bcache0"]
    b.dirty = 5 * MIB
    rig.tick(1)
    real = b.sample
    b.sample = lambda now: dataclasses.replace(real(now), failed=True, dirty_bytes=0)  # type: ignore[method-assign]
    rig.tick(2)
    assert rig.status()["volumes"][0]["detach_loss_bytes"] == 5 * MIB
    rc = cli.main(["detach", "--socket", str(rig.d.config.socket), "bcache0", "--deadline", "2s"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["cachepilot: daemon: bad request: bcache0: refused: the cache device failed holding"
                               f" {5 * MIB} dirty bytes that a detach would lose (--accept-loss detaches anyway)"]
    assert rig.d.lifecycle.detach_requests == []


def test_the_command_line_parses_and_follows_the_detach_to_its_end(rig: Rig, capsys) -> None:  # type: ignore[no-untyped-def]
    from cachepilot.commands import detach as cmd

    p = cli.build_parser("detach")
    a = p.parse_args(["detach", "bcache0", "--deadline", "90s", "--accept-loss"])
    assert (a.volume, a.deadline, a.accept_loss, a.no_wait) == ("bcache0", "90s", True, False)
    p = cli.build_parser("attach")
    a = p.parse_args(["attach", "bcache0", CSET])
    assert (a.volume, a.cache) == ("bcache0", CSET)
    rig.d.start()
    rig.tick(1)
    stop = threading.Event()

    def loop() -> None:  # the daemon's loop by hand; the drain is done as soon as it is asked for
        t = 2.0
        while not stop.is_set():
            b = rig.backends["bcache0"]
            for d in [x for x, _ in b.applied if isinstance(x, Drain)]:
                rig.d.engine.outcome(Outcome(d, DONE, detail="clean"))
            b.applied = [x for x in b.applied if not isinstance(x[0], Drain)]
            if getattr(b, "detached", False):  # the kernel shows the device without its cache from now on
                rig.found = [Found(VolumeInfo(dev=VOL.dev, name="bcache0", kind="bcache", mountpoint="/mnt/x"))]
            rig.tick(t)
            t += 1.0
            time.sleep(0.1)

    runner = threading.Thread(target=loop, daemon=True)
    runner.start()
    try:
        rc = cmd.detach(argparse.Namespace(socket=str(rig.d.config.socket), config=None, volume="bcache0",
                                           deadline="20s", accept_loss=False, no_wait=False))
    finally:
        stop.set()
        runner.join()
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "bcache0: detached (detached); serving from its origin" in out


def test_the_cli_follows_its_own_detach_not_the_failure_of_an_earlier_one(rig: Rig, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Until the daemon's next tick takes a detach up, status still shows the previous request's end: a detach
    retried right after a failed one printed that one's "detach failed" and exited 1 at once (as drain did, lab)."""
    from cachepilot.commands import detach as cmd
    from cachepilot.daemon import control

    rig.d.start()
    rig.tick(1)
    first = rig.d.answer({"cmd": "detach", "volume": "bcache0", "deadline": 60})
    rig.tick(2)
    shown = rig.status()["volumes"][0]["operator_detach"]
    assert shown["request"] == first["request"] and shown["state"] == "draining"

    old = {"state": "failed", "detail": "the drain expired", "elapsed_s": 61.0, "request": 1}
    draining = {"state": "draining", "detail": "", "elapsed_s": 0.5, "request": 2}
    polls = iter([{"volumes": [{"name": "bcache0", "operator_detach": old}]}] * 2
                 + [{"volumes": [{"name": "bcache0", "operator_detach": draining}]}]
                 + [{"volumes": [], "detached": [{"name": "bcache0", "why": "detached", "cache": "c"}]}])

    def request(sock: Path, req: dict) -> dict:  # type: ignore[type-arg]
        if req["cmd"] == "detach":
            return {"queued": "bcache0", "dirty_bytes": 0, "request": 2}
        return next(polls)

    monkeypatch.setattr(control, "request", request)
    monkeypatch.setattr(cmd, "POLL_S", 0.0)
    rc = cmd.detach(argparse.Namespace(socket=str(rig.d.config.socket), config=None, volume="bcache0",
                                       deadline="60s", accept_loss=False, no_wait=False))
    out = capsys.readouterr().out
    assert rc == 0 and "detached (detached)" in out and "failed" not in out, out


def test_a_volume_that_lost_its_cache_while_the_daemon_was_down_is_still_latched_after_the_restart(
        tmp_path: Path) -> None:
    """The last run managed bcache0; it comes back with no cache set and no `cachepilot detach` released it: a
    failed cache device, not an operator's choice -- adopted (to be latched and alerted on), not listed as
    'no cache'."""
    first = Rig(tmp_path)
    first.d.start()
    first.tick(1)
    first.d.shutdown()
    again = Rig(tmp_path)
    again.found = [Found(VolumeInfo(dev=VOL.dev, name="bcache0", kind="bcache", mountpoint="/mnt/x"))]
    again.d.start()
    again.tick(1)
    assert [v["name"] for v in again.status()["volumes"]] == ["bcache0"] and again.status()["detached"] == []
    again.d.shutdown()


def test_a_latched_failed_dm_cache_is_not_called_clean_the_write_policy_names_what_it_held() -> None:
    """A failed dm-cache's status has no figures, so its dirty bytes read 0: the write-policy rule's reason says the
    bytes it held at the failure, not "cache clean"."""
    e = engine("dm-cache")
    tick(e, 1, dirty=10 * MIB)
    acts = tick(e, 2, mode="writethrough", dirty=0, failed=True)
    [sw] = [a for a in acts if isinstance(a, SetWritePolicy)]
    assert f"the cache device failed holding {10 * MIB} dirty bytes it can no longer write back" in sw.reason
    assert "cache clean" not in sw.reason and "--accept-loss" in sw.reason
