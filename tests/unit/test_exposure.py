"""The write-policy safety rules: the failure latch, the exposure bound held by periodic drains (age) and by an
early switch (bytes), breaches, dm-writecache's flush-only bound, and how action outcomes feed back."""

from __future__ import annotations

from collections.abc import Callable

from cachepilot.engine import DiscardRanges, Drain, Engine, Outcome, SetWritePolicy
from cachepilot.events import FileKey, FreedExtent, HotnessDelta, JournalCommit, kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy

NS = 1_000_000_000
DEV = kdev(252, 0)
KIB, MIB = 1 << 10, 1 << 20


def engine(policy: str, kind: str = "bcache", cache_id: str = "cset-A") -> Engine:
    vol = VolumeInfo(dev=DEV, name="vol0", kind=kind, cache_bytes=1 << 30, cache_id=cache_id)
    return Engine(parse_policy(policy, "t.yaml"), [vol])


def sample(e: Engine, t: float, mode: str, dirty: int = 0, errors: int = 0, failed: bool = False,
           cache_id: str = "cset-A") -> None:
    e.sample(VolumeSample(DEV, int(t * NS), mode, dirty, 0, 0, errors, failed, {}, cache_id))


def switches(acts: list) -> list[SetWritePolicy]:  # type: ignore[type-arg]
    return [a for a in acts if isinstance(a, SetWritePolicy)]


def drains(acts: list) -> list[Drain]:  # type: ignore[type-arg]
    return [a for a in acts if isinstance(a, Drain)]


# ---------------------------------------------------------------- the failure latch
RECOVERABLE = "version: 1\ndefaults: {failure_model: recoverable, hysteresis: {min_switch_interval: 60s}}\n"


def _fail_then_idle(e: Engine, until: int) -> list:  # type: ignore[type-arg]
    """Today's sequence: errors -> write-through -> bypass, then the device sits bypassed with no new errors."""
    mode = "writeback"
    seen = []
    sample(e, 1, mode, dirty=5000)
    e.tick(1 * NS)
    for t in range(2, until):
        sample(e, t, mode, dirty=0 if t > 3 else 5000, errors=4)
        for a in e.tick(t * NS):
            seen.append((t, a))
            if isinstance(a, SetWritePolicy):
                mode = {"bypass": "none"}.get(a.mode, a.mode)
    return seen


def test_failure_latches_until_the_cache_device_is_replaced() -> None:
    e = engine(RECOVERABLE)
    seen = _fail_then_idle(e, 400)  # main put the failing device back in write-back after the error window
    modes = [a.mode for _, a in seen if isinstance(a, SetWritePolicy)]
    assert modes == ["writethrough", "bypass"], modes
    assert all("latched" in a.reason for _, a in seen if isinstance(a, SetWritePolicy | Drain))
    assert "4 cache I/O errors on cache cset-A" in e.latched()["vol0"]
    sample(e, 400, "none", cache_id="cset-B")  # a new cache set: the latch is gone, errors start afresh
    acts = e.tick(400 * NS)
    assert [a.mode for a in switches(acts)] == ["writeback"] and e.latched() == {}


def test_operator_clears_the_latch_and_new_errors_latch_again() -> None:
    e = engine(RECOVERABLE)
    _fail_then_idle(e, 100)
    sample(e, 100, "none", errors=4)  # same device, same (old) error count
    assert not [a for a in switches(e.tick(100 * NS)) if a.mode == "writeback"]
    assert "cleared by operator" in (e.clear_latch("vol0") or "")
    sample(e, 101, "none", errors=4)
    assert [a.mode for a in switches(e.tick(101 * NS))] == ["writeback"]
    sample(e, 102, "writeback", errors=5)
    acts = e.tick(102 * NS)
    assert [a.mode for a in switches(acts)] == ["writethrough"] and "latched" in acts[-1].reason


def test_unknown_cache_identity_is_never_taken_for_a_replacement() -> None:
    e = engine(RECOVERABLE, cache_id="")
    sample(e, 1, "writeback", failed=True, cache_id="")
    e.tick(1 * NS)
    sample(e, 2, "none", cache_id="cset-X")  # we never knew which device failed: only an operator can clear
    e.tick(2 * NS)
    assert "vol0" in e.latched()


# ---------------------------------------------------------------- the age bound by construction
DESTRUCTIVE = """version: 1
defaults:
  failure_model: destructive
  exposure: {max_dirty: 64MiB, max_age: 30s}
  hysteresis: {min_switch_interval: 60s}
"""


class FakeCache:
    """Blocks dirty since a time; a drain writes back everything dirty when it started, one tick later."""

    def __init__(self, e: Engine, drains_work: bool = True) -> None:
        self.e = e
        self.dirty: dict[int, int] = {}
        self.mode = "writeback"
        self.drains_work = drains_work
        self.draining: list[int] = []
        self.drain: Drain | None = None

    def write(self, block: int, t: int) -> None:
        if self.mode == "writeback":
            self.dirty.setdefault(block, t)

    def step(self) -> None:
        for b in self.draining:
            self.dirty.pop(b, None)
        self.draining = []
        if self.drain is not None:  # the daemon reports how the drain ended
            self.e.outcome(Outcome(self.drain, "done"))
            self.drain = None

    def apply(self, acts: list) -> None:  # type: ignore[type-arg]
        for a in acts:
            if isinstance(a, SetWritePolicy):
                self.mode = a.mode
            elif isinstance(a, Drain) and self.drains_work:
                self.draining = list(self.dirty)
                self.drain = a

    def oldest_age(self, t: int) -> int:
        return max((t - since for since in self.dirty.values()), default=0)


def _run(e: Engine, cache: FakeCache, seconds: int) -> tuple[int, list]:  # type: ignore[type-arg]
    worst = 0
    seen = []
    sample(e, 0, cache.mode)
    e.tick(0)
    for t in range(1, seconds):
        cache.step()
        cache.write(0, t)  # one 4 KiB block dirtied at t=1, then overwritten: 256 writes/s = 1 MiB/s
        worst = max(worst, cache.oldest_age(t))
        sample(e, t, cache.mode, dirty=4 * KIB * len(cache.dirty))
        acts = e.tick(t * NS)
        seen += [(t, a) for a in acts]
        cache.apply(acts)
    return worst, seen


def test_overwritten_block_is_drained_within_max_age() -> None:
    """The review's case: main kept the age estimate at 1 s while the true age reached 119 s."""
    e = engine(DESTRUCTIVE)
    cache = FakeCache(e)
    worst, seen = _run(e, cache, 200)
    assert worst <= 30, worst
    ds = [a for _, a in seen if isinstance(a, Drain)]
    assert len(ds) >= 6 and all("periodic drain" in a.reason for a in ds)
    assert all(a.deadline_ns - t * NS <= 30 * NS for t, a in seen if isinstance(a, Drain))
    assert e.vols[DEV].breaches == 0 and not switches([a for _, a in seen])


def test_drain_that_misses_its_deadline_is_a_breach() -> None:
    e = engine(DESTRUCTIVE)
    cache = FakeCache(e, drains_work=False)
    _, seen = _run(e, cache, 60)
    first = next(t for t, a in seen if isinstance(a, Drain))
    deadline = next(a.deadline_ns for _, a in seen if isinstance(a, Drain))
    assert deadline <= 31 * NS
    breach = [(t, a) for t, a in seen if "exposure breach" in getattr(a, "reason", "")]
    assert breach and breach[0][0] * NS >= deadline and breach[0][0] <= deadline / NS + 1 and first < breach[0][0]
    kinds = {type(a).__name__ for t, a in breach if t == breach[0][0]}
    assert kinds == {"SetWritePolicy", "Drain"}  # write-through and an active drain, at once
    assert switches([a for _, a in breach])[0].mode == "writethrough"
    assert e.vols[DEV].breaches >= 1 and "missed its deadline" in (e.vols[DEV].breach or "")


def test_a_drain_that_missed_its_deadline_makes_the_next_start_earlier() -> None:
    """A measured fast drain (32 MiB within a tick), then one that hangs to its deadline: that one took at least its
    whole window, so the lead of the next periodic drain is at least that long (an earlier start), not the margin."""
    e = engine(DESTRUCTIVE)
    sample(e, 0, "writeback", dirty=32 * MIB)
    e.outcome(Outcome(drains(e.tick(0))[0], "done"))
    for t in range(1, 30):  # the next drain starts late (lead 3.5 s) and hangs
        sample(e, t, "writeback", dirty=MIB)
        if drains(e.tick(t * NS)):
            break
    hung = e.vols[DEV].drain
    assert hung is not None and hung.start_ns >= 25 * NS
    t += 1
    while e.vols[DEV].breaches == 0:
        sample(e, t, "writeback", dirty=MIB)
        e.tick(t * NS)
        t += 1
    longest = max(took for _, took in e.vols[DEV].drains_done)
    assert longest >= hung.action.deadline_ns - hung.start_ns


def test_byte_bound_switches_before_it_is_crossed() -> None:
    e = engine(DESTRUCTIVE.replace("64MiB", "8MiB"))
    mode = "writeback"
    dirty = 0
    sampled = []
    for t in range(0, 20):
        if mode == "writeback":
            dirty += MIB  # 1 MiB/s of new dirty data, 1 s ticks
        sample(e, t, mode, dirty=dirty)
        sampled.append(dirty)
        for a in switches(e.tick(t * NS)):
            mode = a.mode
            assert "exposure bound" in a.reason
    assert mode == "writethrough"
    assert max(sampled) <= 8 * MIB, sampled  # main switched only after a sample showed more than the bound


def test_dm_writecache_keeps_the_bound_by_flushing_never_by_mode() -> None:
    e = engine(UNDELEGATED.replace("64MiB", "8MiB"), kind="dm-writecache")
    acts_all = []
    for t in range(0, 12):  # 1 MiB/s of new dirty data against an 8 MiB bound
        sample(e, t, "writeback", dirty=t * MIB)
        acts = e.tick(t * NS)
        acts_all += acts
        if drains(acts) and len(drains(acts_all)) == 1:
            assert t * MIB <= 8 * MIB  # flushing starts before a sample could show more than the bound
    assert not switches(acts_all)  # dm-writecache has no write-through
    ds = drains(acts_all)
    assert ds and "no write-through: flushing" in ds[0].reason


# an operator's own max_age above the bound: not delegated to the kernel (engine.nativebound), the daemon flushes
UNDELEGATED = DESTRUCTIVE + "  knobs: {max_age: 60000}\n"


def test_dm_writecache_flush_done_moves_the_clean_point_to_its_start_not_to_now() -> None:
    e = engine(UNDELEGATED, kind="dm-writecache")
    sample(e, 0, "writeback", dirty=4096)
    d = drains(e.tick(0))[0]
    sample(e, 3, "writeback", dirty=8192)  # written while the flush ran: dirty since after 0 s, not after 3 s
    e.tick(3 * NS)
    e.outcome(Outcome(d, "done"))
    assert e.vols[DEV].state.clean_ns == 0 and e.vols[DEV].drain is None


# ---------------------------------------------------------------- outcomes
def test_drain_outcome_moves_the_clean_point_and_failure_breaches() -> None:
    e = engine(DESTRUCTIVE)
    sample(e, 0, "writeback", dirty=4096)
    d = drains(e.tick(0))[0]  # dirty data of unknown age: drain at once
    e.outcome(Outcome(d, "done"))
    assert e.vols[DEV].state.clean_ns == 0 and e.vols[DEV].drain is None
    sample(e, 1, "writeback", dirty=4096)
    assert not drains(e.tick(1 * NS))  # next one is due 15 s after the clean point
    sample(e, 14, "writeback", dirty=4096)
    d2 = drains(e.tick(14 * NS))[0]
    assert d2.deadline_ns == 30 * NS
    e.outcome(Outcome(d2, "failed", detail="dmsetup message failed"))
    acts = e.tick(15 * NS)
    assert switches(acts)[0].mode == "writethrough" and "dmsetup message failed" in switches(acts)[0].reason


def test_failed_discard_is_requeued_with_bounded_retries() -> None:
    e = engine(DESTRUCTIVE.replace("hysteresis", "discard_on_delete: {interval: 1s, min_extent: 4KiB}\n  hysteresis"))
    e.feed(FreedExtent(DEV, 5, 100, 10, False, 1, tid=3))
    e.feed(JournalCommit(DEV, 3, 2))
    sent = []
    for t in range(1, 10):
        for a in e.tick(t * NS):
            if isinstance(a, DiscardRanges):
                sent.append(a)
                e.outcome(Outcome(a, "failed", detail="FITRIM: EBUSY"))
    assert len(sent) == 4  # the first try and three retries, then dropped and counted
    assert all(a.ranges == ((100 * 4096, 10 * 4096),) for a in sent)
    assert e.vols[DEV].freed.stats.dropped_retry_blocks == 10


def test_dm_writecache_breach_is_a_flush_and_ends_when_one_completes() -> None:
    e = engine(UNDELEGATED, kind="dm-writecache")
    sample(e, 0, "writeback", dirty=4096)
    d = drains(e.tick(0))[0]
    sample(e, 16, "writeback", dirty=4096)  # past the deadline (15 s): breach
    acts = e.tick(16 * NS)
    assert not switches(acts) and "exposure breach" in drains(acts)[0].reason and d.deadline_ns == 15 * NS
    e.outcome(Outcome(drains(acts)[0], "done"))
    assert e.vols[DEV].breach is None and e.vols[DEV].breaches == 1


def test_a_breach_drain_refused_while_the_late_one_is_abandoned_is_not_a_second_breach() -> None:
    """At the deadline the engine declares the breach and drains again in the same tick in which the backend is
    still abandoning the late drain: the backend refuses the new one. The breach goes on (one, not two) and the
    next tick drains again."""
    e = engine(DESTRUCTIVE)
    sample(e, 0, "writeback", dirty=4096)
    drains(e.tick(0))
    sample(e, 16, "writeback", dirty=4096)  # past the deadline (15 s): breach, and its own drain
    again = drains(e.tick(16 * NS))[0]
    assert "exposure breach" in again.reason and e.vols[DEV].breaches == 1
    e.outcome(Outcome(again, "failed", detail="vol0: another operation is in progress"))
    assert e.vols[DEV].breaches == 1 and e.vols[DEV].breach is not None
    sample(e, 17, "writeback", dirty=4096)
    assert "exposure breach" in drains(e.tick(17 * NS))[0].reason


def test_a_completed_drain_moves_the_clean_point_to_when_it_read_clean() -> None:
    """A backend reports a drain done once it reads the cache clean: every byte dirty after that tick was written
    after it, so the next drain is due by max_age less its lead after it, not after the drain's start (a drain that
    took 11 s would otherwise be followed by another at once). The lead: the 11 s it took (the longest measured),
    half that and two 1 s ticks = 18.5 s before C + 30 s."""
    e = engine(DESTRUCTIVE)
    sample(e, 0, "writeback", dirty=4096)
    d = drains(e.tick(0))[0]
    for t in range(1, 12):
        sample(e, t, "writeback", dirty=4096)
        assert not drains(e.tick(t * NS))
    e.outcome(Outcome(d, "done"))
    assert e.vols[DEV].state.clean_ns == 11 * NS
    for t in range(12, 22):
        sample(e, t, "writeback", dirty=4096)
        assert not drains(e.tick(t * NS)), t
    sample(e, 22, "writeback", dirty=4096)
    d2 = drains(e.tick(22 * NS))[0]
    assert "starts 18.5 s before max_age 30 s" in d2.reason and d2.deadline_ns == 41 * NS


# ---------------------------------------------------------------- drains timed by their measured duration
def _drain_starts(e: Engine, cache: FakeCache, seconds: int) -> tuple[list[int], int]:
    """Run the overwrite load of _run; (the ticks at which drains started, the oldest dirty age seen)."""
    worst, seen = _run(e, cache, seconds)
    return [t for t, a in seen if isinstance(a, Drain)], worst


def test_a_drain_starts_later_than_at_half_the_bound_when_drains_are_fast() -> None:
    """Issue 23: drains at max_age/2 write back data 1 s old that might have died seconds later. Once a drain was
    measured (one tick here), the next starts as late as its predicted duration and margin allow: every ~26 s,
    not every ~15 s, and the oldest dirty byte still within the 30 s bound, no breach."""
    e = engine(DESTRUCTIVE)
    starts, worst = _drain_starts(e, FakeCache(e), 200)
    gaps = [b - a for a, b in zip(starts[1:], starts[2:], strict=False)]  # after the first measured drain
    assert gaps and min(gaps) >= 24, (starts, gaps)
    assert worst <= 30 and e.vols[DEV].breaches == 0
    d = e.vols[DEV].drains_done
    assert d and all(took <= 2 * NS for _, took in d)


def test_a_drain_never_starts_later_than_the_bound_less_its_predicted_duration() -> None:
    """A drain of 8 MiB measured at 7 s (8/7 MiB/s); then dirty data grows 1 MiB/s. The next drain must start by
    C + 30 s - (dirty at its start / (8/7 MiB/s)): here earlier than at max_age/2, since the drains are slow."""
    e = engine(DESTRUCTIVE)
    sample(e, 0, "writeback", dirty=8 * MIB)
    d = drains(e.tick(0))[0]  # unknown age: at once
    for t in range(1, 8):
        sample(e, t, "writeback", dirty=8 * MIB)
        e.tick(t * NS)
    e.outcome(Outcome(d, "done"))  # 8 MiB in 7 s
    clean = e.vols[DEV].state.clean_ns
    assert clean == 7 * NS
    start = None
    for t in range(8, 40):
        dirty = (t - 7) * MIB
        sample(e, t, "writeback", dirty=dirty)
        if drains(e.tick(t * NS)):
            start = t, dirty
            break
    assert start is not None
    t, dirty = start
    assert t * NS + dirty * 7 * NS // (8 * MIB) <= clean + 30 * NS  # room for the predicted duration
    assert t * NS < clean + 15 * NS  # slow drains start before max_age/2
    drain = e.vols[DEV].drain
    assert drain is not None and "(longest 7.0 s)" in drain.action.reason  # explain: the measured drain


def test_a_late_drain_starts_early_when_the_byte_bound_would_force_write_through() -> None:
    """Starting late lets dirty data grow for longer: once it could pass 3/4 of max_dirty (64 MiB) before the
    drain would end, the drain starts, before the write policy has to switch to write-through."""
    e = engine(DESTRUCTIVE)
    sample(e, 0, "writeback", dirty=32 * MIB)
    d = drains(e.tick(0))[0]
    e.outcome(Outcome(d, "done"))  # 32 MiB within a tick: the lead rule alone would wait until t = 26
    for t in range(1, 30):
        sample(e, t, "writeback", dirty=t * 4 * MIB)  # 4 MiB/s
        acts = e.tick(t * NS)
        assert not switches(acts)
        if drains(acts):
            assert "could reach" in drains(acts)[0].reason and t * 4 * MIB <= 48 * MIB
            return
    raise AssertionError("no drain before the byte bound")


def test_a_clean_volume_is_not_drained_even_after_a_long_tick() -> None:
    """W3 on dm-cache (issue 23): a read-mostly volume whose samples read 0 dirty bytes was 'drained' every ~30 s
    ('last known clean 0 s ago'), because a long tick (a drain's table reloads block the loop) made the
    one-tick look-ahead reach past max_age/2; on dm-cache each drain replaces smq by the cleaner policy and throws
    away its hotspot statistics. Nothing dirty: nothing to drain, whatever the last tick's length."""
    e = engine(DESTRUCTIVE, kind="dm-cache")
    sample(e, 0, "writeback")
    e.tick(0)
    seen = []
    for t in (20, 40, 41, 70, 71):  # ticks 20-30 s apart, as a stalled loop makes them
        sample(e, t, "writeback", dirty=0)
        seen += drains(e.tick(t * NS))
    assert seen == [], [a.reason for a in seen]
    sample(e, 72, "writeback", dirty=4 * KIB)  # dirty again: the guarantee still holds from the last clean sample
    sample(e, 90, "writeback", dirty=4 * KIB)
    assert drains(e.tick(90 * NS)), "dirty data older than max_age/2 is drained"


# ---------------------------------------------------------------- a trickle of writes on dm-cache: write-through
def _io(e: Engine, t: int, read: int, write: int) -> None:
    """What the probe reports of the volume's files in one second: ``read`` and ``write`` bytes."""
    e.feed(HotnessDelta(FileKey(DEV, 1000 + t, 1), 1, 1 if write else 0, read, write, t * NS, size=128 * KIB))


def _zipf_readers(kind: str, seconds: int, write_of: Callable[[int], int] = lambda t: 4 * KIB,
                  start_mode: str = "writeback") -> tuple[list[tuple[int, SetWritePolicy | Drain]], str]:
    """W3's shape: 16 MiB/s of buffered reads, a few KiB/s of small writes (ext4's atime and journal) that dirty
    the cache while it is in write-back. The fake cache takes the engine's switches and drains."""
    e = engine(DESTRUCTIVE, kind=kind)
    mode, dirty, seen = start_mode, 0, []
    for t in range(seconds):
        _io(e, t, 16 * MIB, write_of(t))
        if mode == "writeback" and t > 0:  # the run starts clean
            dirty += write_of(t)
        sample(e, t, mode, dirty=dirty)
        for a in e.tick(t * NS):
            if isinstance(a, SetWritePolicy):
                seen.append((t, a))
                mode, dirty = a.mode, 0  # dm-cache drains (the cleaner) before it reports the switch done
                e.outcome(Outcome(a, "done"))
            elif isinstance(a, Drain):
                seen.append((t, a))
                dirty = 0
                e.outcome(Outcome(a, "done"))
    return seen, mode


def test_a_read_mostly_dm_cache_volume_runs_write_through_instead_of_being_drained() -> None:
    """W3 (issue 23): under the destructive default a read-mostly dm-cache volume got ~1.3 MiB dirty from a trickle
    of small writes and was drained, and on dm-cache a drain is a reload to the cleaner policy and back, which loses
    smq's hotspot queue and per-block levels. Write-through instead: one switch (its own drain of what is dirty),
    then nothing dirty and no drain at all; the reason says why, for `explain`."""
    seen, mode = _zipf_readers("dm-cache", 600)
    assert mode == "writethrough"
    assert [type(a).__name__ for _, a in seen] == ["SetWritePolicy"], [(t, a.reason) for t, a in seen]
    t, a = seen[0]
    assert t <= 2 and "read-mostly" in a.reason and "cleaner" in a.reason and "hotspot" in a.reason, a.reason


def test_write_back_again_once_writes_pick_up_with_hysteresis() -> None:
    """Between the marks (10-20% of the bytes written) a write-through volume stays; at 30% it goes back to
    write-back, after the hysteresis interval, and says why."""
    def share(pct: int, after: int) -> Callable[[int], int]:
        return lambda t: 16 * MIB * pct // (100 - pct) if t >= after else 4 * KIB

    seen, mode = _zipf_readers("dm-cache", 400, share(15, 100))
    assert mode == "writethrough" and len(seen) == 1, [(t, a.reason) for t, a in seen]
    seen, mode = _zipf_readers("dm-cache", 400, share(30, 100))
    back = [(t, a) for t, a in seen if isinstance(a, SetWritePolicy) and a.mode == "writeback"]
    assert back and back[0][0] >= 100 and "writes picked up" in back[0][1].reason, [(t, a.reason) for t, a in seen]


def test_a_trickle_on_bcache_is_still_write_back_with_periodic_drains() -> None:
    """bcache's drain (writeback_percent 0) replaces no policy: the destructive default keeps write-back there."""
    seen, mode = _zipf_readers("bcache", 120)
    assert mode == "writeback" and seen and all(isinstance(a, Drain) for _, a in seen)


def test_too_little_io_to_tell_changes_no_mode() -> None:
    """Under MIN_RECENT_IO bytes in the window the rule says nothing: an idle dm-cache volume stays as it is."""
    for start in ("writeback", "writethrough"):
        e = engine(DESTRUCTIVE, kind="dm-cache")
        for t in range(60):
            sample(e, t, start)
            assert not switches(e.tick(t * NS)), start


def test_after_a_breach_write_back_resumes_by_hysteresis_not_after_min_switch_interval() -> None:
    """A breach forces write-through; once its drain reads the cache clean and the writes are slow, write-back
    comes back within seconds, even with min_switch_interval at 5 min (issue 31)."""
    e = engine(DESTRUCTIVE.replace("min_switch_interval: 60s", "min_switch_interval: 300s"))
    cache = FakeCache(e, drains_work=False)
    _, seen = _run(e, cache, 45)
    breach = next(t for t, a in seen if isinstance(a, SetWritePolicy) and "exposure breach" in a.reason)
    assert cache.mode == "writethrough" and e.vols[DEV].bound_wt is not None
    cache.drains_work = True
    back = None
    for t in range(45, 120):
        cache.step()
        sample(e, t, cache.mode, dirty=4 * KIB * len(cache.dirty))
        acts = e.tick(t * NS)
        cache.apply(acts)
        if any(isinstance(a, SetWritePolicy) and a.mode == "writeback" for a in acts):
            back = t
            break
    assert back is not None and back - breach < 60, (breach, back)
