"""The exposure bound delegated to the kernel, where the kind has the mechanism (Capabilities.native_bound).

Under the destructive model the daemon otherwise drains every dirty block at least once per max_age (engine.drains):
on dm-writecache a ``flush`` message, which writes back young data that would have died in the cache. What the
6.1 sources give instead (drivers/md/dm-writecache.c):

- ``max_age`` (a table argument, ms): a block's age is taken when it gets its cache entry (``writecache_insert_entry``
  sets ``e->age``; a later write to the same block overwrites it in place and keeps that age, ``writecache_map_write``).
  ``writecache_writeback`` writes entries back from the old end of the LRU while the oldest is at least 15/16 of
  max_age old, and ``writecache_max_age_timer`` queues it every max_age/16: every block is queued for write-back
  by max_age after its first write; when it is written depends on the origin keeping up.
- ``high_watermark``/``low_watermark`` (percent of the blocks in use, every one of which is dirty: a block written
  back is freed, ``__writecache_endio_ssd``): write-back starts above high (``writecache_verify_watermark``) and
  goes on, oldest first, until below low.
- both wait until the origin has had no write for ``pause_writeback`` (3 s by default, SSD mode; idle time of the
  writes ``writecache_map`` sends to the origin), except under ``flush`` or ``cleaner``. Writes go there when no
  block is free, and so does the second flush bio of every REQ_PREFLUSH (``writecache_map_flush``: an empty
  REQ_OP_WRITE): under an fsync-heavy load the origin never idles and neither bound writes anything back (lab,
  W4: stock passed its 50% watermark at ~10 s and wrote nothing back until full at ~22 s). So the rule also
  asks for ``pause_writeback`` 0: write-back then competes with the foreground's origin I/O, as a drain does.
- a table reload keeps the cache: the old table's suspend commits (``writecache_suspend``), the new one's resume
  reads the committed entries back (``writecache_resume``), but gives each of them the resume time as its age.
- a discard frees the dirty entries it covers (``writecache_discard``): deleted files are still not written back.

So the rule asks once, when it adopts the volume, for max_age = the policy's age bound, pause_writeback 0 and
watermarks that keep the dirty data at HEADROOM of max_dirty, all in one table reload (each reload suspends the
device; one per argument made a tick of 8.5-11.5 s in the TCG lab), put back when the daemon stops or, in one reload
too, as soon as the volume's failure model is no longer destructive (a policy reload), and from then on plans no
periodic drain: the kernel writes back oldest first, young data keeps its chance to die.
A drain (the flush) comes only on a measured breach: dirty bytes over max_dirty, or more dirty bytes than were written
to the volume within the last max_age (those bytes are provably older than the bound). The witness is one-sided:
a dirty total below what was written says nothing about the oldest block's age.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from cachepilot.engine.exposure import tick_ns
from cachepilot.engine.knobs import knob_value
from cachepilot.engine.lifetime import Hold
from cachepilot.engine.volumectl import NS, VolumeCtl
from cachepilot.models.counterwindow import CounterWindow

HEADROOM = 0.75  # the watermark keeps dirty data at this share of max_dirty: write-back lags a pass behind it
GAP = 5  # percent points between high and low watermark (the kernel's own defaults are 50 and 45)
STOCK_HIGH = 50  # HIGH_WATERMARK in dm-writecache.c: a max_dirty above it asks for no watermark change

ORDER = ("low_watermark", "high_watermark", "max_age", "pause_writeback")  # every argument wanted() may ask for


def wanted(max_age_s: float, max_dirty: int, cache_bytes: int) -> list[Hold]:
    """The table arguments that make the kernel keep the bound, in an order each reload accepts (the kernel refuses
    a high watermark below the low one: low goes first)."""
    age_ms = max(1, round(max_age_s * 1000))
    out = [Hold("max_age", age_ms, (
        f"exposure bound delegated to the kernel: max_age {age_ms} ms writes back, oldest first, every block first"
        f" written 15/16 of it ago (checked every max_age/16) instead of a flush of every block each"
        f" {max_age_s / 2:g} s; a flush only on a measured breach")),
        Hold("pause_writeback", 0, (
            "exposure bound delegated to the kernel: its write-back (max_age and watermarks) otherwise waits until"
            " the origin has had no write for 3 s, and every fsync's flush goes to the origin as a write"
            " (writecache_map_flush): under a syncing load it would never run"))]
    if cache_bytes <= 0:
        return out
    high = min(STOCK_HIGH, int(100 * HEADROOM * max_dirty // cache_bytes))
    if high < STOCK_HIGH:
        low = max(0, high - GAP)
        why = (f"exposure bound delegated to the kernel: max_dirty {max_dirty >> 20} MiB is"
               f" {100 * max_dirty / cache_bytes:.1f}% of the cache; write-back from {high}% to {low}% in use"
               f" ({HEADROOM:.0%} of it) so the dirty data stays below the bound")
        out = [Hold("low_watermark", low, why), Hold("high_watermark", high, why), *out]
    return out


class _Written:
    """Bytes written to the target over about the last max_age (its one counter, from the samples)."""

    def __init__(self) -> None:
        self.window = CounterWindow()

    @property
    def marks(self) -> deque[tuple[int, tuple[int, ...]]]:
        return self.window.marks

    def note(self, ts: int, total: int | None, keep_ns: int) -> None:
        if total is None:
            self.window.clear()
        else:
            self.window.note(ts, (total,), keep_ns)

    def since(self, ts: int, age_ns: int) -> int | None:
        """Bytes written from ``age_ns`` before ``ts`` on, at most (the oldest mark kept is the newest one that
        old); None: no mark is that old yet."""
        return self.window.growth()[0] if self.window.spans(ts, age_ns) else None


RequestMany = Callable[[list[tuple[str, str, str]]], None]  # (knob, value, why) each: asked together, put back on exit
PutBack = Callable[[tuple[str, ...], str], None]  # steered knobs back as found, and why


class NativeBound:
    """Each volume's delegated bound: the knob requests, whether the table holds them, and the breach witness."""

    def __init__(self) -> None:
        self.written: dict[int, _Written] = {}
        self.asked: dict[int, set[str]] = {}  # the table arguments asked for since the bound was last put back

    def forget(self, dev: int) -> None:
        """A volume gone: its backend put back what it steered (restore) and a new one starts afresh."""
        self.written.pop(dev, None)
        self.asked.pop(dev, None)

    def steer(self, c: VolumeCtl, model: tuple[str, str], latched: bool, request: RequestMany,
              put_back: PutBack) -> None:
        """One tick: note the volume's written bytes; under the destructive model ask for the table arguments
        (:func:`wanted`) the policy does not pin, together; under another (a policy reload changed the model, or the
        volume now falls under a rule that has another) put back those asked for, together. Latched: neither."""
        st, ex = c.state, c.policy.exposure
        w = self.written.setdefault(c.info.dev, _Written())
        w.note(st.last_ts, st.written_bytes, int(ex.max_age_s * NS))
        if latched or not (c.caps.native_bound and st.samples > 0):
            return
        asked = self.asked.setdefault(c.info.dev, set())
        asked -= set(c.policy.knobs)  # pinned now: the operator's, not ours to put back
        if model[0] == "destructive":
            wants = [(h.knob, str(h.value), h.reason) for h in wanted(ex.max_age_s, ex.max_dirty, c.info.cache_bytes)
                     if h.knob not in c.policy.knobs]
            asked.update(k for k, _, _ in wants)
            request(wants)
        elif asked:
            knobs = tuple(k for k in ORDER if k in asked)
            for k in knobs:
                c.requested_knobs.pop(k, None)  # asked again at once should the model come back
            asked.clear()
            put_back(knobs, (f"{model[1]}, not destructive: the exposure bound is no longer delegated to the kernel;"
                             f" the table arguments that kept it go back to the values found, in one reload"))

    @staticmethod
    def pending(c: VolumeCtl, now: int) -> bool:
        """The table arguments were asked for within the last two ticks: their reloads and the sample reading
        them back are under way. The drain of dirty data of unknown age waits for them (a reload restarts every
        entry's age, ``writecache_resume``, so max_age then writes it all back), two ticks at most: a refused
        reload leaves the drains as they were."""
        req = c.requested_knobs.get("max_age")
        ours = str(max(1, round(c.policy.exposure.max_age_s * 1000)))
        return (c.caps.native_bound and req is not None and req[0] == ours
                and now - req[1] <= 2 * tick_ns(c, now))

    @staticmethod
    def holds(c: VolumeCtl) -> bool:
        """The table as last read keeps the bound: max_age at most the policy's (a pinned one counts as the
        operator's), the high watermark at most the wanted one."""
        if not c.caps.native_bound:
            return False
        ex, knobs = c.policy.exposure, c.state.knobs
        for want in wanted(ex.max_age_s, ex.max_dirty, c.info.cache_bytes):
            if want.knob == "low_watermark":
                continue
            have = knob_value(want.knob, knobs.get(want.knob))
            if have is None or have > want.value:
                return False
        return True

    def breach(self, c: VolumeCtl) -> str | None:
        """A measured breach of the delegated bound, or None: dirty bytes over max_dirty, or more dirty bytes than
        were written within the last max_age."""
        st, ex = c.state, c.policy.exposure
        if st.dirty_bytes > ex.max_dirty:
            return (f"delegated bound breached: {st.dirty_bytes} dirty bytes over max_dirty {ex.max_dirty} (the"
                    f" kernel's write-back is behind)")
        w = self.written.get(c.info.dev)
        recent = None if w is None else w.since(st.last_ts, int(ex.max_age_s * NS))
        if recent is not None and st.dirty_bytes > recent:
            return (f"delegated bound breached: {st.dirty_bytes} dirty bytes but only {recent} written in the last"
                    f" {ex.max_age_s:g} s, so {st.dirty_bytes - recent} are older than max_age")
        return None
