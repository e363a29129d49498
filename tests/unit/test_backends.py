"""Backends on fixture sysfs trees and a fake dmsetup: every write read back and logged, drains that wait for
clean, switches that never bypass a dirty cache, failures classified and counted, nothing half-applied."""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from cachepilot.actions import Drain, SetKnob, SetWritePolicy
from cachepilot.backends import open_backend
from cachepilot.backends.base import DONE, FAILED, PENDING, SKIPPED
from cachepilot.backends.bcache import BcacheBackend, size_matches, size_text
from cachepilot.backends.dmcache import CacheTable, DmCacheBackend
from cachepilot.backends.host import Host
from cachepilot.backends.inspect import sample_volume
from cachepilot.backends.kernelio import classify_dmsetup, classify_errno
from cachepilot.backends.writecache import WritecacheBackend, WritecacheTable
from cachepilot.errors import DeviceGone, KernelRejected, RetryLater
from cachepilot.models.volume import VolumeInfo, VolumeState

S = 1_000_000_000


# ------------------------------------------------------------------ bcache on a fixture tree
def bcache_tree(root: Path, *, mode: str = "writeback", dirty: str = "24.0M", state: str = "dirty") -> Path:
    d = root / "block" / "bcache0" / "bcache"
    (d / "stats_total").mkdir(parents=True)
    cset = root / "fs" / "bcache" / "uuid"
    (cset / "cache0").mkdir(parents=True)
    (d / "cache").symlink_to(cset)
    modes = " ".join(f"[{m}]" if m == mode else m for m in ("writethrough", "writeback", "writearound", "none"))
    files = {"cache_mode": modes, "dirty_data": dirty, "state": state, "writeback_percent": "10",
             "writeback_running": "1", "writeback_delay": "30", "sequential_cutoff": "4.0M", "writeback_rate": "4.0k",
             "writeback_rate_minimum": "8", "writeback_rate_update_seconds": "5",
             "stats_total/cache_hits": "5", "stats_total/cache_misses": "7",
             "stats_total/cache_bypass_hits": "2", "stats_total/cache_bypass_misses": "9",
             "stats_total/bypassed": "1.5M"}
    for name, value in files.items():
        (d / name).write_text(value + "\n")
    (cset / "cache0" / "io_errors").write_text("0\n")
    (cset / "congested_read_threshold_us").write_text("2000\n")
    (cset / "cache_available_percent").write_text("73\n")
    return d


class FakeBcacheFile:
    """Makes cache_mode behave like the kernel's: a written mode reads back bracketed."""

    @staticmethod
    def normalise(d: Path) -> None:
        raw = (d / "cache_mode").read_text().strip()
        if "[" not in raw:
            modes = ("writethrough", "writeback", "writearound", "none")
            (d / "cache_mode").write_text(" ".join(f"[{m}]" if m == raw else m for m in modes) + "\n")


@pytest.fixture
def bc(tmp_path, monkeypatch):
    d = bcache_tree(tmp_path)
    import cachepilot.backends.bcache as mod

    real_write = mod.write_attr

    def write(path: Path, value: str) -> None:
        if path.name == "writeback_rate":  # written in sectors/s, shown in bytes/s, rounded as the kernel prints
            n = int(value) * 512
            value = f"{n / (1 << 20):.1f}M" if n >= 1 << 20 else f"{n / 1024:.1f}k"
        real_write(path, value)
        if path.name == "cache_mode":
            FakeBcacheFile.normalise(d)

    monkeypatch.setattr(mod, "write_attr", write)
    b = open_backend(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path))
    assert isinstance(b, BcacheBackend)
    return b, d


def test_a_bcache_sample_reads_the_slow_attributes_every_five_seconds_and_after_an_action(bc, monkeypatch):
    """Issue 32: bcache folds stats_total every 300/22 s and knobs change at a write, so a tick reads the mode, the
    cache's health and dirty_data (4 attributes) and the other 10 only every 5 s or right after an action."""
    import cachepilot.backends.bcache as mod

    b, d = bc
    reads: list[str] = []
    real = mod.read_attr

    def counting(path: str) -> str:
        reads.append(str(path))
        return real(path)

    monkeypatch.setattr(mod, "read_attr", counting)
    first = b.sample(0)
    assert len(reads) == 14 and first.hits == 5 and first.knobs["writeback_percent"] == "10"
    (d / "stats_total" / "cache_hits").write_text("50\n")
    (d / "dirty_data").write_text("1.0M\n")
    reads.clear()
    fast = b.sample(S)
    assert len(reads) == 4 and fast.dirty_bytes == 1 << 20 and fast.hits == 5  # the fold not read yet
    assert fast.knobs == first.knobs and fast.writeback == first.writeback
    reads.clear()
    assert b.sample(5 * S).hits == 50 and len(reads) == 14
    assert b.apply(SetKnob("bcache0", "sequential_cutoff", "0", "pin")).status == DONE
    reads.clear()
    assert size_matches(b.sample(6 * S).knobs["sequential_cutoff"], "0") and len(reads) == 14  # read back at once


def test_bcache_drain_waits_for_clean_then_puts_percent_back(bc, caplog):
    b, d = bc
    caplog.set_level(logging.INFO, "cachepilot.backends")
    out = b.apply(Drain("bcache0", 10 * S, "age bound"))
    assert out.status == PENDING
    assert (d / "writeback_percent").read_text().strip() == "0"
    assert [w.target for w in out.writes] == [
        "bcache0 writeback_running", "bcache0 writeback_delay", "bcache0 writeback_percent"]
    assert out.writes[2].before == "10" and out.writes[2].readback == "0"
    assert "10 -> 0" in caplog.text and "age bound" in caplog.text
    assert b.step(1 * S) == [] and b.pending() == [out.action]
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    done = b.step(2 * S)
    assert [o.status for o in done] == [DONE]
    assert (d / "writeback_percent").read_text().strip() == "10"
    assert (d / "writeback_delay").read_text().strip() == "30"
    assert b.pending() == []


def test_a_paced_bcache_drain_throttles_write_back_to_its_rate_and_puts_everything_back(bc, caplog):
    """engine/pacing.py: writeback_percent 1 (so read_dirty() is rate-limited), the floor and the rate at the asked
    rate, the controller's update every second; all put back once clean."""
    b, d = bc
    caplog.set_level(logging.INFO, "cachepilot.backends")
    out = b.apply(Drain("bcache0", 30 * S, "age bound", rate=2 << 20))
    assert out.status == PENDING
    got = {w.target.split()[1]: w.readback for w in out.writes}
    assert got == {"writeback_running": "1", "writeback_delay": "0", "writeback_rate": str(2 << 20),
                   "writeback_percent": "1", "writeback_rate_minimum": "4096", "writeback_rate_update_seconds": "1"}
    assert "paced drain: age bound" in caplog.text
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    assert [o.status for o in b.step(2 * S)] == [DONE]
    for name, before in (("writeback_percent", "10"), ("writeback_rate_minimum", "8"),
                         ("writeback_rate_update_seconds", "5"), ("writeback_delay", "30")):
        assert (d / name).read_text().strip() == before, name
    assert (d / "writeback_rate").read_text().strip() == "2.0M"  # the kernel's controller recomputes it


def test_a_paced_bcache_drain_that_falls_behind_goes_to_the_full_rate_and_still_puts_back(bc):
    """24 MiB dirty at 2 MiB/s takes 12 s: paced while that is at most half the time left to the deadline (30 s),
    full rate (writeback_percent 0) once a burst keeps it from falling; the value found (10) put back when clean."""
    b, d = bc
    b.apply(Drain("bcache0", 30 * S, "age bound", rate=2 << 20))
    assert b.step(1 * S) == [] and (d / "writeback_percent").read_text().strip() == "1"
    assert b.step(5 * S) == [] and (d / "writeback_percent").read_text().strip() == "1"  # 12 s of 25 s left
    assert b.step(7 * S) == []  # 12 s of work, 23 s left: behind
    assert (d / "writeback_percent").read_text().strip() == "0"
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    assert [o.status for o in b.step(12 * S)] == [DONE]
    assert (d / "writeback_percent").read_text().strip() == "10"


def test_bcache_drain_missing_deadline_fails_and_restores(bc):
    b, d = bc
    b.apply(Drain("bcache0", 5 * S, "age bound"))
    out = b.step(6 * S)
    assert out[0].status == FAILED and isinstance(out[0].error, RetryLater)
    assert "deadline" in str(out[0].error)
    assert (d / "writeback_percent").read_text().strip() == "10"
    assert b.errors["retry"] == 1


def test_bcache_writethrough_switch_stops_new_dirt_then_drains(bc):
    b, d = bc
    out = b.apply(SetWritePolicy("bcache0", "writethrough", "destructive bound"))
    assert out.status == PENDING
    assert "[writethrough]" in (d / "cache_mode").read_text()
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    [done] = b.step(1 * S)
    assert done.status == DONE and done.detail == "writethrough, clean"
    assert (d / "writeback_percent").read_text().strip() == "10"


def test_bcache_bypass_only_once_clean(bc):
    b, d = bc
    out = b.apply(SetWritePolicy("bcache0", "bypass", "cache failing"))
    assert out.status == PENDING
    assert "[writethrough]" in (d / "cache_mode").read_text()  # never none while dirty
    b.step(1 * S)
    assert "[none]" not in (d / "cache_mode").read_text()
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    [done] = b.step(2 * S)
    assert done.status == DONE, done.line()
    assert "[none]" in (d / "cache_mode").read_text()


def test_bcache_dry_run_writes_nothing_but_says_what(bc):
    b, d = bc
    out = b.apply(SetWritePolicy("bcache0", "writethrough", "x"), dry_run=True)
    assert out.dry_run and out.writes[0].value == "writethrough" and out.writes[0].readback == "(dry run)"
    assert "[writeback]" in (d / "cache_mode").read_text()
    assert (d / "writeback_percent").read_text().strip() == "10"
    assert b.pending() == []


def test_bcache_knobs_are_parsed_ranged_and_read_back(bc):
    b, d = bc
    out = b.apply(SetKnob("bcache0", "sequential_cutoff", "8MiB", "policy"))
    assert out.status == DONE and (d / "sequential_cutoff").read_text().strip() == str(8 << 20)
    out = b.apply(SetKnob("bcache0", "writeback_percent", "41", "policy"))
    assert out.status == FAILED and "outside 0..40" in str(out.error)
    out = b.apply(SetKnob("bcache0", "congested_read_threshold_us", "0", "policy"))
    assert out.status == DONE
    assert (d / "cache" / "congested_read_threshold_us").read_text().strip() == "0"
    out = b.apply(SetKnob("bcache0", "migration_threshold", "1", "policy"))
    assert out.status == FAILED and isinstance(out.error, KernelRejected)


def test_bcache_write_not_read_back_is_rejected(bc, monkeypatch):
    b, d = bc
    import cachepilot.backends.bcache as mod
    monkeypatch.setattr(mod, "write_attr", lambda path, value: None)  # the kernel ignores the write
    out = b.apply(SetKnob("bcache0", "writeback_percent", "20", "policy"))
    assert out.status == FAILED and "reads back '10'" in str(out.error)
    assert b.errors["rejected"] == 1


def test_bcache_vanishing_volume_is_device_gone(bc):
    b, d = bc
    (d / "dirty_data").unlink()
    out = b.apply(Drain("bcache0", 10 * S, "x"))
    assert out.status == FAILED and isinstance(out.error, DeviceGone)
    assert b.errors["gone"] == 1


def test_bcache_restore_puts_saved_values_back(bc):
    b, d = bc
    b.apply(Drain("bcache0", 10 * S, "x"))
    [out] = b.restore()
    assert out.status == FAILED and out.error is None and "abandoned" in out.detail
    assert (d / "writeback_percent").read_text().strip() == "10"


def test_bcache_sample_reads_the_tree(bc):
    b, _ = bc
    s = b.sample(123)
    assert (s.mode, s.dirty_bytes, s.hits, s.misses, s.ts_ns) == ("writeback", 24 << 20, 5, 7, 123)


@pytest.mark.parametrize("rb, want, ok", [("4.0M", str(4 << 20), True), ("8.0M", str(4 << 20), False),
                                          ("512", "512", True), ("1.5k", "1536", True), ("1.5k", "4096", False)])
def test_bcache_size_readback(rb, want, ok):
    assert size_matches(rb, want) is ok


# ------------------------------------------------------------------ a fake dmsetup
class FakeDm:
    """Just enough of dmsetup and the kernel: a live and an inactive table, dirty blocks, messages, failures."""

    def __init__(self, table: str, dirty: int = 10) -> None:
        self.live = table
        self.inactive: str | None = None
        self.dirty = dirty
        self.calls: list[tuple[str, ...]] = []
        self.fail: dict[str, str] = {}  # verb -> stderr
        self.core = {"migration_threshold": "2048"}
        self.used = 100
        self.dirty_on_reload: int | None = None  # blocks a load dirties between a status read and a reload

    def __call__(self, args: Sequence[str], timeout: float) -> str:
        args = tuple(args)
        self.calls.append(args)
        verb = args[0]
        if verb in self.fail:
            from cachepilot.backends.kernelio import classify_dmsetup
            raise classify_dmsetup(args, self.fail[verb])
        if verb == "table":
            return self.live
        if verb == "reload":
            self.inactive = args[3]
            if self.dirty_on_reload is not None:
                self.dirty, self.dirty_on_reload = self.dirty_on_reload, None
            return ""
        if verb == "clear":
            self.inactive = None
            return ""
        if verb == "resume" and self.inactive:
            self.live, self.inactive = self.inactive, None
            return ""
        if verb in ("suspend", "resume"):
            return ""
        if verb == "message":
            if args[3] == "migration_threshold":
                self.core["migration_threshold"] = args[4]
            elif args[3] == "flush":
                self.used = 0
            return ""
        if verb == "status":
            if " writecache " in self.live:
                return f"0 2097152 writecache 0 1000 {1000 - self.used} 0"
            t = CacheTable.parse(self.live)
            core = " ".join(f"{k} {v}" for k, v in self.core.items())
            return (f"0 2097152 cache 8 27/4096 128 100/3840 5 6 7 8 0 9 {self.dirty} {len(t.features)} "
                    f"{' '.join(t.features)} {2 * len(self.core)} {core} {t.policy} 0 rw -")
        raise AssertionError(args)


def dm_tree(root: Path, name: str = "lab-cached") -> None:
    (root / "block" / "dm-2" / "dm").mkdir(parents=True)
    (root / "block" / "dm-2" / "dm" / "name").write_text(name + "\n")


CACHE_TABLE = "0 2097152 cache 253:2 253:3 253:0 128 1 writeback smq 2 migration_threshold 2048"


@pytest.fixture
def dmc(tmp_path):
    dm_tree(tmp_path)
    fake = FakeDm(CACHE_TABLE)
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind="dm-cache"), host=Host(sysfs=tmp_path, dm=fake))
    assert isinstance(b, DmCacheBackend)
    return b, fake


def test_cache_table_round_trip():
    t = CacheTable.parse(CACHE_TABLE)
    assert t.line() == CACHE_TABLE and t.mode == "writeback" and t.policy == "smq"
    assert t.with_(mode="passthrough", policy="cleaner").line() == \
        "0 2097152 cache 253:2 253:3 253:0 128 1 passthrough cleaner 2 migration_threshold 2048"


def test_dmcache_drain_uses_the_cleaner_then_the_previous_policy(dmc):
    b, fake = dmc
    out = b.apply(Drain("dm-2", 10 * S, "age bound"))
    assert out.status == PENDING
    assert CacheTable.parse(fake.live).policy == "cleaner" and CacheTable.parse(fake.live).mode == "writethrough"
    assert ("suspend", "lab-cached") in fake.calls and ("resume", "lab-cached") in fake.calls
    assert b.step(1 * S) == []
    fake.dirty = 0
    [done] = b.step(2 * S)
    assert done.status == DONE
    assert fake.live == CACHE_TABLE


def test_dmcache_reload_carries_the_live_migration_threshold(dmc):
    b, fake = dmc
    assert b.apply(SetKnob("dm-2", "migration_threshold", "4096", "x")).status == DONE
    assert ("message", "lab-cached", "0", "migration_threshold", "4096") in fake.calls
    b.apply(Drain("dm-2", 10 * S, "x"))
    assert fake.live.endswith("cleaner 2 migration_threshold 4096")


def test_dmcache_passthrough_only_from_clean_through_writethrough(dmc):
    b, fake = dmc
    out = b.apply(SetWritePolicy("dm-2", "bypass", "cache failing"))
    assert out.status == PENDING
    t = CacheTable.parse(fake.live)
    assert (t.mode, t.policy) == ("writethrough", "cleaner")
    fake.dirty = 0
    [done] = b.step(1 * S)
    assert done.status == DONE, done.line()
    t = CacheTable.parse(fake.live)
    assert (t.mode, t.policy) == ("passthrough", "smq")


def test_dmcache_refused_reload_leaves_the_old_table_and_says_so(dmc):
    b, fake = dmc
    fake.fail["reload"] = "device-mapper: reload ioctl on lab-cached failed: Invalid argument"
    out = b.apply(SetWritePolicy("dm-2", "writethrough", "x"))
    assert out.status == FAILED and isinstance(out.error, KernelRejected)
    assert fake.live == CACHE_TABLE
    assert b.errors["rejected"] == 1


def test_dmcache_busy_step_is_retried_with_backoff(dmc):
    b, fake = dmc
    b.apply(Drain("dm-2", 100 * S, "x"))
    fake.fail["status"] = "device-mapper: Device or resource busy"
    assert b.step(1 * S) == [] and b.errors["retry"] == 1
    del fake.fail["status"]
    fake.dirty = 0
    assert b.step(1 * S + 1) == []  # still backing off
    [done] = b.step(3 * S)
    assert done.status == DONE


def test_dmcache_gone(dmc):
    b, fake = dmc
    fake.fail["table"] = "Device does not exist."
    out = b.apply(SetWritePolicy("dm-2", "writethrough", "x"))
    assert isinstance(out.error, DeviceGone)


# ------------------------------------------------------------------ dm-writecache
WC_TABLE = "0 2097152 writecache s 253:0 253:1 4096 4 high_watermark 50 low_watermark 45"


def wc_backend(tmp_path: Path, fake: FakeDm) -> WritecacheBackend:
    """A dm-writecache backend on a fixture tree, its dmsetup answered by ``fake``."""
    dm_tree(tmp_path)
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind="dm-writecache"), host=Host(sysfs=tmp_path, dm=fake))
    assert isinstance(b, WritecacheBackend)
    return b


@pytest.fixture
def wc(tmp_path):
    fake = FakeDm(WC_TABLE)
    return wc_backend(tmp_path, fake), fake


def test_writecache_table_round_trip():
    t = WritecacheTable.parse(WC_TABLE)
    assert t.line() == WC_TABLE and t.get("low_watermark") == "45"
    assert WritecacheTable.parse("0 8 writecache s 1:1 1:2 4096 1 cleaner").get("cleaner") is None


def flushed(b: WritecacheBackend, action: Drain) -> list:
    """Apply a drain, wait for its flush thread, step: the drain's outcomes."""
    assert b.apply(action).status == PENDING
    fl = b._flush_in_flight
    assert fl is not None and fl.done.wait(5)
    return b.step(0)


def test_writecache_drain_is_the_flush_message(wc):
    b, fake = wc
    [out] = flushed(b, Drain("dm-2", 10 * S, "x"))
    assert out.status == DONE and out.writes[0].readback == "0 used blocks"
    assert ("message", "lab-cached", "0", "flush") in fake.calls


def test_writecache_flush_is_done_when_the_message_returns_though_new_writes_came(tmp_path):
    class Busy(FakeDm):  # a steady load: blocks written while the flush ran are cached again
        def __call__(self, args: Sequence[str], timeout: float) -> str:
            out = super().__call__(args, timeout)
            if args[0] == "message" and args[3] == "flush":
                self.used = 7
            return out

    fake = Busy(WC_TABLE)
    b = wc_backend(tmp_path, fake)
    [out] = flushed(b, Drain("dm-2", 10 * S, "x"))
    assert out.status == DONE and "7 written since" in out.detail and b.pending() == []
    assert [c for c in fake.calls if c[0] == "message"] == [("message", "lab-cached", "0", "flush")]  # once


def test_a_long_writecache_flush_does_not_hold_the_loop(tmp_path):
    """The flush message returns only once every block is written back (minutes on a slow origin): it runs on its
    own thread, apply and step return at once with the blocks left, and a second drain waits on the same flush."""
    import threading

    release = threading.Event()

    class Slow(FakeDm):
        def __call__(self, args: Sequence[str], timeout: float) -> str:
            if args[0] == "message" and args[3] == "flush":
                assert release.wait(10)
            return super().__call__(args, timeout)

    fake = Slow(WC_TABLE)
    fake.used = 300
    b = wc_backend(tmp_path, fake)
    assert b.apply(Drain("dm-2", 10 * S, "first")).status == PENDING
    fake.used = 120  # written back meanwhile
    assert b.step(0) == [] and "120 of 300 used blocks left" in b._ops[0].phase
    assert b.apply(Drain("dm-2", 10 * S, "second")).status == PENDING  # rides on the drain in flight
    release.set()
    assert b._flush_in_flight is not None and b._flush_in_flight.done.wait(5)
    outs = b.step(0)
    assert [o.status for o in outs] == [DONE, DONE] and b.pending() == []
    assert [c for c in fake.calls if c[0] == "message"] == [("message", "lab-cached", "0", "flush")]


def test_a_failed_writecache_flush_fails_the_drain(wc):
    b, fake = wc
    fake.fail["message"] = "device-mapper: message ioctl on lab-cached failed: Input/output error"
    [out] = flushed(b, Drain("dm-2", 10 * S, "x"))
    assert out.status == FAILED and b.pending() == []


def test_writecache_watermark_by_reload_and_no_writethrough(wc):
    b, fake = wc
    assert b.apply(SetKnob("dm-2", "low_watermark", "10", "x")).status == DONE
    assert WritecacheTable.parse(fake.live).get("low_watermark") == "10"
    out = b.apply(SetWritePolicy("dm-2", "writethrough", "x"))
    assert out.status == FAILED and "write-back only" in str(out.error)


# ------------------------------------------------------------------ steered knobs put back on exit (engine.lifetime)
def test_bcache_steered_knob_is_put_back_on_exit(tmp_path):
    d = bcache_tree(tmp_path)
    b = open_backend(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path))
    for v in ("25", "30"):
        assert b.apply(SetKnob("bcache0", "writeback_percent", v, "hold", True)).status == DONE
    b.apply(SetKnob("bcache0", "sequential_cutoff", "0", "pinned"))  # not steered: stays
    assert b.steered_knobs() == {"writeback_percent": ("10", "30")}  # what the state file keeps against a kill
    [out] = b.restore()
    assert b.steered_knobs() == {}
    assert out.status == DONE and out.action.value == "10" and "steered to 30" in out.action.reason
    assert out.writes[0].before == "30" and out.writes[0].readback == "10"
    assert (d / "writeback_percent").read_text().strip() == "10"
    assert (d / "sequential_cutoff").read_text().strip() == "0"
    assert b.restore() == []  # once
    assert b.sample(S).in_use_percent == 27  # 100 - cache_available_percent


def test_bcache_steered_size_knob_is_put_back_in_bytes_not_in_its_rounded_print(tmp_path):
    # the crash lab run logged "put back on exit failed: write '4.0M' ... Invalid argument": the value found before
    # steering is bcache's own print, which its parser (bch_strtoul_h) refuses
    d = bcache_tree(tmp_path)
    assert (d / "sequential_cutoff").read_text().strip() == "4.0M"
    b = open_backend(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path))
    assert b.apply(SetKnob("bcache0", "sequential_cutoff", "0", "small-file creates", True)).status == DONE
    [out] = b.restore()
    assert out.status == DONE and out.action.value == "4.0M", out
    assert (d / "sequential_cutoff").read_text().strip() == str(4 << 20)
    assert size_matches("4.0M", "4.0M") and size_matches(str(4 << 20), "4.0M") and not size_matches("0", "4.0M")
    assert size_text("4.0M") == str(4 << 20) and size_text("512") == "512"


def test_bcache_steered_knob_changed_by_someone_else_is_left_alone(tmp_path):
    d = bcache_tree(tmp_path)
    b = open_backend(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path))
    b.apply(SetKnob("bcache0", "writeback_percent", "30", "hold", True))
    (d / "writeback_percent").write_text("20\n")  # an operator
    [out] = b.restore()
    assert out.status == SKIPPED and "left alone" in out.detail
    assert (d / "writeback_percent").read_text().strip() == "20"


def test_bcache_knob_set_for_its_own_sake_drops_the_put_back(tmp_path):
    d = bcache_tree(tmp_path)
    b = open_backend(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path))
    b.apply(SetKnob("bcache0", "writeback_percent", "30", "hold", True))
    b.apply(SetKnob("bcache0", "writeback_percent", "35", "pinned by policy"))
    assert b.restore() == []
    assert (d / "writeback_percent").read_text().strip() == "35"


def test_writecache_sample_reports_and_restore_puts_back_the_high_watermark(tmp_path):
    fake = FakeDm(WC_TABLE)
    b = wc_backend(tmp_path, fake)
    assert b.sample(S).knobs == {"high_watermark": "50", "low_watermark": "45"}
    assert b.apply(SetKnob("dm-2", "high_watermark", "80", "hold", True)).status == DONE
    assert b.sample(S).knobs == {"high_watermark": "80", "low_watermark": "45"}
    [out] = b.restore()
    assert out.status == DONE and WritecacheTable.parse(fake.live).get("high_watermark") == "50"


# ------------------------------------------------------------------ dm-writecache's max_age (engine.nativebound)
def test_backend_sets_max_age_by_reload_and_puts_back_an_unset_one(tmp_path):
    fake = FakeDm(WC_TABLE)
    b = wc_backend(tmp_path, fake)
    assert "max_age" not in b.sample(S).knobs
    for knob, value in (("max_age", "30000"), ("low_watermark", "13"), ("high_watermark", "18"),
                        ("pause_writeback", "0")):
        assert b.apply(SetKnob("dm-2", knob, value, "delegated", True)).status == DONE
    live = WritecacheTable.parse(fake.live)
    assert live.get("max_age") == "30000" and live.line() == fake.live
    assert b.sample(S).knobs == {"high_watermark": "18", "low_watermark": "13", "max_age": "30000",
                                 "pause_writeback": "0"}
    outs = b.restore()
    assert all(o.status == DONE for o in outs), outs
    t = WritecacheTable.parse(fake.live)
    assert t.get("max_age") is None and "max_age" not in fake.live  # taken out again: the kernel's default
    assert "pause_writeback" not in fake.live
    assert (t.get("high_watermark"), t.get("low_watermark")) == ("50", "45")


def test_sample_reports_the_bytes_written_from_the_status_statistics(tmp_path):
    class Stats(FakeDm):
        def __call__(self, args: Sequence[str], timeout: float) -> str:
            if args[0] == "status":
                return "0 2097152 writecache 0 1000 900 0 10 5 77 1 2 0 3 0 4 0"
            return super().__call__(args, timeout)

    dm_tree(tmp_path)
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind="dm-writecache", cache_bytes=1000 * 4096),
                     host=Host(sysfs=tmp_path, dm=Stats(WC_TABLE)))
    assert b.sample(S).written_bytes == 77 * 4096


# ------------------------------------------------------------------ classification
def test_errors_are_classified():
    assert isinstance(classify_errno(errno.EINVAL, "w"), KernelRejected)
    assert isinstance(classify_errno(errno.ENODEV, "w"), DeviceGone)
    assert isinstance(classify_errno(errno.EBUSY, "w"), RetryLater)
    assert isinstance(classify_dmsetup(["x"], "Device does not exist."), DeviceGone)
    assert isinstance(classify_dmsetup(["x"], "ioctl failed: Device or resource busy"), RetryLater)
    assert isinstance(classify_dmsetup(["x"], "ioctl failed: Invalid argument"), KernelRejected)


def test_wrong_volume_and_busy_volume(bc):
    b, _ = bc
    assert b.apply(Drain("bcache9", S, "x")).status == FAILED
    b.apply(Drain("bcache0", 10 * S, "x"))
    out = b.apply(SetWritePolicy("bcache0", "bypass", "x"))  # neither rides on a drain nor folds into one
    assert out.status == FAILED and isinstance(out.error, RetryLater)


# ------------------------------------------------------------------ a drain and a switch never collide (issue 31)
def test_bcache_writethrough_asked_during_a_drain_is_folded_into_it(bc):
    """W1's sync-heavy outside workload: the exposure rule asked for write-through while a drain ran; the switch
    was refused ("another operation is in progress") and the drain failed. Now the switch rides on the drain:
    write-through at once, the drain goes on, and its end leaves write-through (the drain's write-back settings
    are put back, the mode is not)."""
    b, d = bc
    drain = Drain("bcache0", 100 * S, "age bound")
    b.apply(drain)
    out = b.apply(SetWritePolicy("bcache0", "writethrough", "exposure bound"))
    assert out.status == PENDING and "rides on the drain" in out.detail
    assert "[writethrough]" in (d / "cache_mode").read_text()  # no new dirty data from now on
    assert set(b.pending()) == {drain, out.action}
    assert b.step(1 * S) == []
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    done = b.step(2 * S)
    assert [(o.action.kind, o.status) for o in done] == [("drain", DONE), ("set_write_policy", DONE)]
    assert "[writethrough]" in (d / "cache_mode").read_text()
    assert (d / "writeback_percent").read_text().strip() == "10"  # the drain's own settings are put back
    assert b.pending() == []


def test_bcache_writethrough_folded_into_a_drain_in_its_last_stretch_stays(bc):
    """A drain in its write-through tail saved write-back to put back; a switch folded into it drops that."""
    b, d = bc
    b.apply(Drain("bcache0", 100 * S, "age bound"))
    b.step(1 * S)
    (d / "dirty_data").write_text("96.0k\n")
    b.step(2 * S)  # closing: write-through for the tail, write-back saved
    assert "[writethrough]" in (d / "cache_mode").read_text()
    assert b.apply(SetWritePolicy("bcache0", "writethrough", "exposure bound")).status == PENDING
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    assert [o.status for o in b.step(3 * S)] == [DONE, DONE]
    assert "[writethrough]" in (d / "cache_mode").read_text()


def test_a_drain_asked_during_a_writethrough_switch_rides_on_it(bc):
    """The switch drains to clean anyway: the drain asked for meanwhile (the age bound) ends with it."""
    b, d = bc
    sw = b.apply(SetWritePolicy("bcache0", "writethrough", "exposure bound"))
    assert sw.status == PENDING
    out = b.apply(Drain("bcache0", 50 * S, "age bound"))
    assert out.status == PENDING and "rides on the set_write_policy" in out.detail
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    assert [(o.action.kind, o.status) for o in b.step(1 * S)] == [("set_write_policy", DONE), ("drain", DONE)]


def test_a_riding_drain_keeps_its_own_deadline(bc):
    b, d = bc
    b.apply(SetWritePolicy("bcache0", "writethrough", "exposure bound"))
    b.apply(Drain("bcache0", 5 * S, "age bound"))
    [late] = b.step(6 * S)
    assert late.action.kind == "drain" and late.status == FAILED and "deadline" in str(late.error)
    assert [a.kind for a in b.pending()] == ["set_write_policy"]  # the switch goes on


def test_riders_fail_with_the_operation_they_rode_on(bc):
    b, d = bc
    b.apply(Drain("bcache0", 5 * S, "age bound"))
    b.apply(SetWritePolicy("bcache0", "writethrough", "exposure bound"))
    out = b.step(6 * S)
    assert [(o.action.kind, o.status) for o in out] == [("drain", FAILED), ("set_write_policy", FAILED)]
    assert b.pending() == []


# ------------------------------------------------------------------ cache identity (ends a failure latch)
def test_samples_carry_the_cache_identity(tmp_path):
    from cachepilot.backends.inspect import sample_volume

    bcache_tree(tmp_path)
    s = sample_volume(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path), now_ns=1)
    assert s.cache_id == "uuid"  # the cache set the volume is attached to
    assert (s.hits, s.misses, s.bypasses, s.bypassed_bytes) == (5, 7, 11, 3 << 19)  # bcache's bypass counters
    (tmp_path / "block" / "bcache0" / "bcache" / "cache").unlink()  # detached
    (tmp_path / "block" / "bcache0" / "bcache" / "cache0").mkdir()
    s = sample_volume(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path), now_ns=1)
    assert s.cache_id == "" and s.failed


@pytest.mark.parametrize(("kind", "table", "status", "want"), [
    ("dm-cache", "0 2097152 cache 254:3 254:4 254:1 128 1 writeback smq 0",
     "0 2097152 cache 8 27/4096 128 10/2048 1 2 3 4 0 0 0 1 writeback 2 migration_threshold 2048 smq 0 rw -",
     "254:4"),
    ("dm-writecache", "0 2097152 writecache s 254:1 254:5 4096 0", "0 2097152 writecache 0 65536 65000 0", "254:5"),
])
def test_dm_samples_carry_the_cache_device(tmp_path, kind, table, status, want):
    from cachepilot.backends.inspect import sample_volume

    (tmp_path / "block" / "dm-2" / "dm").mkdir(parents=True)
    (tmp_path / "block" / "dm-2" / "dm" / "name").write_text("lab-cached\n")

    def dm(args: Sequence[str], timeout: float) -> str:
        return {"status": status, "table": table}[args[0]]

    info = VolumeInfo(dev=2, name="dm-2", kind=kind, cache_bytes=65536 * 4096)
    assert sample_volume(info, host=Host(sysfs=tmp_path, dm=dm), now_ns=1).cache_id == want


def test_bcache_drain_closes_in_writethrough_once_write_back_is_moving(bc):
    """Under a steady write load dirty data never reads 0 in write-back: once the write-back thread has brought it
    down (to an eighth of the start, or 1 MiB) the drain goes write-through for the tail, then puts write-back back
    with the other settings."""
    b, d = bc
    b.apply(Drain("bcache0", 100 * S, "age bound"))
    assert b.step(1 * S) == [] and "[writeback]" in (d / "cache_mode").read_text()
    (d / "dirty_data").write_text("4.0M\n")  # 24 MiB at the start: not yet an eighth
    assert b.step(2 * S) == [] and "[writeback]" in (d / "cache_mode").read_text()
    (d / "dirty_data").write_text("96.0k\n")
    assert b.step(3 * S) == [] and "[writethrough]" in (d / "cache_mode").read_text()
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    [done] = b.step(4 * S)
    assert done.status == DONE and "[writeback]" in (d / "cache_mode").read_text()
    assert (d / "writeback_percent").read_text().strip() == "10"
    assert [w.target for w in done.writes][-4:] == [
        "bcache0 cache_mode", "bcache0 writeback_percent", "bcache0 writeback_delay", "bcache0 writeback_running"]


def test_bcache_drain_closes_late_in_its_window_even_if_write_back_is_slow(bc):
    b, d = bc
    b.apply(Drain("bcache0", 21 * S, "age bound"))
    assert b.step(1 * S) == []  # the window: 1 s .. 21 s; the last quarter starts at 16 s
    assert b.step(15 * S) == [] and "[writeback]" in (d / "cache_mode").read_text()
    assert b.step(16 * S) == [] and "[writethrough]" in (d / "cache_mode").read_text()
    [failed] = b.step(22 * S)
    assert failed.status == FAILED and "[writeback]" in (d / "cache_mode").read_text()


def test_dmcache_drain_runs_in_writethrough_from_its_start_then_loads_writeback_again(dmc):
    """Under load dm-cache writes back only blocks older than its writeback sentinels, so a block made dirty
    while a drain runs in writeback could outlast the drain's deadline: the drain loads writethrough with the
    cleaner at once, and its end loads writeback with the previous policy."""
    b, fake = dmc
    fake.dirty = 400  # 25 MiB of 64 KiB blocks
    b.apply(Drain("dm-2", 100 * S, "age bound"))
    t = CacheTable.parse(fake.live)
    assert (t.mode, t.policy) == ("writethrough", "cleaner")
    assert b.step(1 * S) == []
    fake.dirty = 0
    [done] = b.step(3 * S)
    assert done.status == DONE and fake.live == CACHE_TABLE


def test_dmcache_clean_switch_to_writethrough_and_back_keeps_smq(dmc):
    """A clean volume's switch is one reload smq -> smq each way, never through the cleaner: smq's per-block levels
    come back as hints only when the saved policy name matches (dm-cache-metadata.c, policy_unchanged), which a
    cleaner in between breaks. The engine's write-through for read-mostly dm-cache volumes relies on this."""
    b, fake = dmc
    fake.dirty = 0
    assert b.apply(SetWritePolicy("dm-2", "writethrough", "read-mostly")).status == DONE
    reloads = [CacheTable.parse(c[3]) for c in fake.calls if c[0] == "reload"]
    assert [(t.mode, t.policy) for t in reloads] == [("writethrough", "smq")]
    assert b.apply(SetWritePolicy("dm-2", "writeback", "writes picked up")).status == DONE
    assert fake.live == CACHE_TABLE and not any("cleaner" in c[3] for c in fake.calls if c[0] == "reload")


def test_dmcache_blocks_dirtied_during_a_clean_switch_are_drained_not_a_failure(dmc):
    """The lab (W3, issue 23): the cache read clean, then 12 blocks were written in write-back before the reload to
    writethrough took effect, and the switch failed ("writethrough with 12 dirty blocks after switching"). They are
    drained with the cleaner like any others, and the switch ends in writethrough with the previous policy."""
    b, fake = dmc
    fake.dirty, fake.dirty_on_reload = 0, 12
    out = b.apply(SetWritePolicy("dm-2", "writethrough", "read-mostly"))
    assert out.status == PENDING, out.line()
    assert (CacheTable.parse(fake.live).mode, CacheTable.parse(fake.live).policy) == ("writethrough", "cleaner")
    fake.dirty = 0
    [done] = b.step(1 * S)
    assert done.status == DONE, done.line()
    assert (CacheTable.parse(fake.live).mode, CacheTable.parse(fake.live).policy) == ("writethrough", "smq")


def test_bcache_io_errors_decay_but_the_exported_count_never_goes_back(tmp_path: Path) -> None:
    d = bcache_tree(tmp_path)
    errors = d.parent.parent.parent / "fs" / "bcache" / "uuid" / "cache0" / "io_errors"
    info = VolumeInfo(dev=1, name="bcache0", kind="bcache")
    st = VolumeState(info)
    risen = []
    for ts, value in enumerate((0, 3, 1, 1, 2)):  # bcache halves its count as I/O goes by (io_error_halflife)
        errors.write_text(f"{value}\n")
        st.update(sample_volume(info, host=Host(sysfs=tmp_path), now_ns=ts + 1))
        risen.append(st.io_errors_risen)
    assert risen == [0, 3, 3, 3, 4]


def test_bcache_steering_sequential_cutoff_does_not_wait_for_a_drain(bc):
    # W1: the engine's sequential_cutoff steering was refused ("another operation is in progress") for the whole of
    # each drain and retried tick after tick; the knob is one no drain or switch writes.
    b, d = bc
    assert b.apply(Drain("bcache0", 10 * S, "age bound")).status == PENDING
    out = b.apply(SetKnob("bcache0", "sequential_cutoff", "32MiB", "small-file creates"))
    assert out.status == DONE and (d / "sequential_cutoff").read_text().strip() == str(32 << 20)
    refused = b.apply(SetKnob("bcache0", "writeback_percent", "20", "lifetime hold"))  # the drain's own knob waits
    assert refused.status == FAILED and isinstance(refused.error, RetryLater)
    assert (d / "writeback_percent").read_text().strip() == "0" and b.pending()


def test_riders_are_abandoned_with_their_operation_at_restore_without_an_error(bc):
    b, d = bc
    b.apply(Drain("bcache0", 50 * S, "age bound"))
    b.apply(SetWritePolicy("bcache0", "writethrough", "exposure bound"))
    out = b.restore()
    assert [(o.action.kind, o.status, o.error) for o in out] == [("drain", FAILED, None),
                                                                 ("set_write_policy", FAILED, None)]
    assert b.errors["retry"] == 0 and b.pending() == []


def test_a_bcache_drain_reads_dirty_data_once_a_step(bc, monkeypatch):
    """Issue 32 item 3: one sysfs read per attribute per step. A drain's step tested clean and then the close
    threshold, reading dirty_data twice (and the start read it twice too)."""
    b, d = bc
    import cachepilot.backends.bcache as mod
    reads: list[str] = []
    real_read = mod.read_attr

    def counting(path: Path) -> str:
        reads.append(Path(path).name)
        return real_read(path)

    monkeypatch.setattr(mod, "read_attr", counting)
    assert b.apply(Drain("bcache0", 10 * S, "age bound")).status == PENDING
    assert reads.count("dirty_data") == 1
    for t in (1, 2, 3):
        reads.clear()
        assert b.step(t * S) == []
        assert reads.count("dirty_data") == 1, reads

