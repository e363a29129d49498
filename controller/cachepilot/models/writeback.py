"""Is the stock cache's write-back making progress? Two findings, from the samples alone (issue 36 items 3 and 4):

- **stalled**: dirty data has not fallen for ``after`` seconds while write-back should run -- a drain is in flight,
  the kind was told not to write back at all (bcache ``writeback_running`` 0), or dirty data is above the level the
  kind holds by design (bcache's ``writeback_percent`` target, dm-writecache's ``high_watermark``; dm-cache holds
  none: smq cleans everything once the origin idles). Why is read from the same samples: the knob that stops it,
  writes that kept the origin busy (dm-cache's smq does not clean at all while busy: dm-cache-policy-smq.c
  ``clean_target_met``), writes that hit blocks already cached (the same blocks dirtied again and again), or nothing
  at all reaching the volume (the origin or the cache is stuck).
- **all dirty**: (nearly) every block dm-cache has mapped is dirty: what it loads after an unclean shutdown
  (dm-cache-metadata.c ``__load_mapping_v1``/``__load_mapping_v2`` start each valid block as dirty and keep its
  saved bit only when the superblock says the last shutdown was clean; ``sync_metadata`` in dm-cache-target.c
  writes the dirty bitset and that flag only at ``cache_postsuspend``). Named with the time to clean at the
  write-back rate measured from the falling dirty data.

Nothing here acts: the daemon reports (status, metrics, explain) and leaves the operator's knobs alone."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

NS = 1_000_000_000
RATE_WINDOW_NS = 120 * NS  # the write-back rate is measured over about this much of falling dirty data
ALL_DIRTY = 0.98  # dirty / mapped at or above this: every mapped block is dirty (a few may have been cleaned since)
ALL_DIRTY_END = 0.9  # ... and the finding ends below this (hysteresis), or when the cache reads clean
MIN_MAPPED_BYTES = 1 << 20  # below this a cache is too empty to say anything about how it came back


@dataclass(frozen=True, slots=True)
class WritebackView:
    """What one sample says about write-back beyond the dirty bytes; None where the kind has no such figure."""

    running: bool | None = None  # bcache writeback_running (False: its write-back thread is told to stop)
    rate_bytes: int | None = None  # bcache writeback_rate, bytes/s (the PI controller's current rate)
    hold_bytes: int = 0  # dirty data the kind keeps on purpose; write-back "should run" only above it
    quiet_s: float = 0.0  # the kind may write nothing back this long by design (bcache's writeback_delay sleep)
    writes: int | None = None  # cumulative writes the cache target counted (any unit: only its rise matters)
    overwrites: int | None = None  # cumulative writes to blocks already cached (dm-cache / dm-writecache write hits)
    mapped_bytes: int | None = None  # dm-cache: bytes of cache blocks mapped (its used blocks)
    policy: str = ""  # dm-cache's policy (cleaner: write-back of everything, idle or not)
    note: str = ""  # a kind-specific fact for the explanation (e.g. dm-cache metadata read-only)
    # why the kind writes nothing back while writes keep coming, if it does so by design ("": it does not)
    busy_hold: str = ""


@dataclass(slots=True)
class Finding:
    """A stall or an all-dirty cache found or ended: the daemon records it (explain) and logs it."""

    volume: str
    kind: str  # "writeback_stall" | "all_dirty"
    found: bool  # True: found; False: ended
    why: str
    ts_ns: int


@dataclass
class WritebackWatch:
    """One volume's watch (kept in its VolumeCtl)."""

    since_ns: int | None = None  # start of the stretch in which dirty has not fallen while write-back should run
    prev_dirty: int | None = None
    base: tuple[int | None, int | None, int] = (None, None, 0)  # writes, overwrites, eBPF write bytes at since_ns
    stalled_ns: int | None = None  # when the stall was declared (None: not stalled)
    cause: str = ""
    all_dirty_ns: int | None = None  # when every mapped block was found dirty (None: not so)
    came_back: bool = False  # found at the volume's first sample (as it came up) rather than later
    marks: deque[tuple[int, int]] = field(default_factory=deque)  # (ts, dirty) while dirty falls: the rate
    rate: float = 0.0  # bytes/s written back, measured from falling dirty data (0: not measured)
    samples: int = 0
    last_ns: int = 0  # the last sample's time
    maps: bool = False  # the kind reports its mapped blocks (dm-cache): whether "all dirty" can be said at all

    def carried(self) -> dict[str, float] | None:
        """What the state file keeps of a stretch without progress (its age at the last sample and the dirty data
        then), so that a restart does not start ``health.stall_after`` again; None outside such a stretch."""
        if self.since_ns is None or self.prev_dirty is None:
            return None
        return {"stalled_s": round(self.stalled_s(self.last_ns), 3), "dirty": float(self.prev_dirty)}

    def resume(self, stalled_s: float, dirty: int, now_ns: int) -> None:
        """A stretch a previous run left (``carried`` + the time the daemon was down): it goes on only if the next
        sample's dirty data has not fallen below ``dirty`` (observe compares with it as with any previous sample)."""
        if self.since_ns is None and self.samples == 0 and stalled_s >= 0 and dirty > 0:
            self.since_ns, self.prev_dirty = now_ns - int(stalled_s * NS), dirty

    def stalled_s(self, now_ns: int) -> float:
        """Seconds dirty data has not fallen while write-back should run (0 outside such a stretch)."""
        return 0.0 if self.since_ns is None else max(0.0, (now_ns - self.since_ns) / NS)

    def clean_eta_s(self, dirty: int) -> float | None:
        """Seconds to clean ``dirty`` bytes at the measured write-back rate (None: no rate measured yet)."""
        if dirty <= 0:
            return 0.0
        return dirty / self.rate if self.rate > 0 else None

    def observe(self, name: str, ts: int, dirty: int, view: WritebackView | None, draining: bool,
                after_s: float, written: int) -> list[Finding]:
        """One sample: ``draining`` -- a drain of the daemon's or an operator's is in flight; ``after_s`` -- the
        policy's ``health.stall_after`` (0: stalls are not looked for); ``written`` -- the volume's cumulative write
        bytes as the probe counted them. Returns what was found or ended."""
        v = view or WritebackView()
        out: list[Finding] = []
        self._rate(ts, dirty)
        fell = self.prev_dirty is not None and dirty < self.prev_dirty
        self.prev_dirty, self.last_ns = dirty, ts
        should = dirty > 0 and (draining or v.running is False or dirty > v.hold_bytes or v.policy == "cleaner")
        if not should or fell or after_s <= 0:
            self.since_ns = ts if should and after_s > 0 else None
            self.base = (v.writes, v.overwrites, written)
            if self.stalled_ns is not None:
                why = "dirty data falls again" if fell else "write-back need not run now" if dirty else "clean"
                out.append(Finding(name, "writeback_stall", False, f"stall over: {why}", ts))
                self.stalled_ns, self.cause = None, ""
        elif self.since_ns is None:
            self.since_ns, self.base = ts, (v.writes, v.overwrites, written)
        else:
            self.cause = self._cause(dirty, v, draining, ts, written)
            if self.stalled_ns is None and self.stalled_s(ts) >= max(after_s, v.quiet_s):
                self.stalled_ns = ts
                out.append(Finding(name, "writeback_stall", True, self.cause, ts))
        out.extend(self._all_dirty(name, ts, dirty, v))
        self.samples += 1
        return out

    def _rate(self, ts: int, dirty: int) -> None:
        """The write-back rate: how fast dirty data fell over the last stretch it fell (kept while it does not)."""
        if self.marks and dirty > self.marks[-1][1]:
            self.marks.clear()  # grew: a new stretch begins (the last rate stays the measured one)
        self.marks.append((ts, dirty))
        while len(self.marks) > 2 and self.marks[1][0] <= ts - RATE_WINDOW_NS:
            self.marks.popleft()
        (t0, d0), (t1, d1) = self.marks[0], self.marks[-1]
        if t1 > t0 and d0 > d1:
            self.rate = (d0 - d1) * NS / (t1 - t0)

    def _cause(self, dirty: int, v: WritebackView, draining: bool, ts: int, written: int) -> str:
        secs = self.stalled_s(ts)
        head = f"{dirty} dirty bytes have not fallen for {secs:.0f} s" + (" during a drain" if draining else "")
        w0, o0, b0 = self.base
        wrote = written - b0
        rose = v.writes is not None and w0 is not None and v.writes > w0
        over = v.overwrites - o0 if v.overwrites is not None and o0 is not None else 0
        if v.running is False:
            return (f"{head}: writeback_running is 0, bcache's write-back thread is stopped (set outside cachepilot,"
                    " which leaves it so: only a drain turns it on, for its duration, and puts 0 back -- each write"
                    " is in explain); echo 1 > writeback_running resumes it")
        if v.note:
            return f"{head}: {v.note}"
        rate = f" ({wrote / max(secs, 1):.0f} B/s)" if wrote > 0 else ""
        if v.busy_hold and (over > 0 or wrote > 0 or rose):
            # the kind writes nothing back while writes come: that, not a race with write-back, keeps dirty data up
            # (lab: dm-writecache under an fsync loop rewriting one block wrote nothing back at all)
            again = f", {over} of them to blocks already cached" if over > 0 else ""
            return f"{head}: writes kept coming{rate}{again}; {v.busy_hold}"
        if over > 0:
            return (f"{head}: {over} writes hit blocks already cached -- the same blocks are dirtied again as fast as"
                    " they are written back")
        if wrote > 0 or rose:
            wb = f" at {v.rate_bytes} B/s" if v.rate_bytes is not None else ""
            return (f"{head}: write-back runs{wb} but new writes{rate} keep up with it (the same data dirtied again,"
                    " or more written than the origin takes)")
        if v.rate_bytes is not None and v.rate_bytes <= _BCACHE_MIN_RATE:
            return (f"{head}: no writes came, and bcache writes back at its minimum rate ({v.rate_bytes} B/s) above"
                    " its target: writeback_percent or writeback_rate_minimum hold it back")
        return (f"{head}: no writes came and nothing was written back: the origin does not take writes (failing or"
                " stuck: its latency in vmstat -d, errors in journalctl -k) or the cache's write-back is held")

    def _all_dirty(self, name: str, ts: int, dirty: int, v: WritebackView) -> list[Finding]:
        mapped = v.mapped_bytes
        self.maps = mapped is not None
        first = self.samples == 0
        if self.all_dirty_ns is None:
            if mapped is not None and mapped >= MIN_MAPPED_BYTES and dirty >= ALL_DIRTY * mapped:
                self.all_dirty_ns, self.came_back = ts, first
                how = "came back with" if first else "has"
                eta = self.clean_eta_s(dirty)
                return [Finding(name, "all_dirty", True,
                                f"{how} every mapped block dirty ({dirty} of {mapped} bytes): what dm-cache loads after"
                                " an unclean shutdown (no clean-shutdown flag in its metadata); "
                                + (f"{eta:.0f} s to clean at the measured {self.rate:.0f} B/s" if eta is not None
                                   else "the time to clean follows once write-back has been measured"), ts)]
            return []
        if dirty == 0 or mapped is None or dirty < ALL_DIRTY_END * mapped:
            self.all_dirty_ns = None
            return [Finding(name, "all_dirty", False, f"no longer all dirty ({dirty} dirty bytes)", ts)]
        return []


_BCACHE_MIN_RATE = 8 * 512  # writeback_rate_minimum's default: 8 sectors/s
