"""Promotion planning: the promotion queue leaves as Promote actions within the volume's byte budget, and the
believed-cached set is re-queued (re-warmed) after a scan, a hit-ratio drop, a refresh interval or a new cache."""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from cachepilot.actions import Action, Promote
from cachepilot.engine.drains import drain_at_risk
from cachepilot.engine.handoff import end_loan
from cachepilot.engine.promoqueue import ADMITTED
from cachepilot.engine.volumectl import NS, VolumeCtl
from cachepilot.models.columns import U32_MAX
from cachepilot.models.hotness import F_MEMBER, F_QUEUED, F_RESIDENT, HotnessTable

# A scan: cold files touched more than SCAN_START times the usual rate (which must be at least SCAN_MIN_BASE files a
# second to judge), over until under SCAN_END times it; it re-warms only past SCAN_POLLUTES of the cache in cold bytes.
SCAN_MIN_BASE = 8.0
SCAN_START, SCAN_END = 2.5, 1.5
SCAN_POLLUTES = 0.25
SPILLED = U32_MAX - 1  # a size column's raw value, less one, at which the size is kept apart (models/columns.py)


class Promoter:
    """Turns each volume's promotion queue into Promote actions and re-warms its believed-cached set."""

    def __init__(self, hotness: HotnessTable) -> None:
        self.hotness = hotness

    def promote(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        promo = c.policy.promotion
        t = self.hotness
        end_loan(c, now)
        if not c.promotes:
            for slot in c.promo_queue.clear():
                t.flags[slot] &= ~F_QUEUED
            return
        if c.latch is not None:
            return  # reading hot files into a failed cache helps nobody; the queue waits
        if drain_at_risk(c, now):
            return  # the queue waits: promotion reads keep the origin busy, and this kind cleans best when it idles
        if (promo.refresh_interval_s > 0 and not c.scanning
                and now - c.last_refresh_ns >= promo.refresh_interval_s * NS):
            c.last_refresh_ns = now
            self.rewarm(c, "refresh: hot file idle for a refresh interval",
                         idle_since_ns=now - int(promo.refresh_interval_s * NS))
        dt = (now - c.last_tick_ns) / NS if c.last_tick_ns is not None else 1.0
        cap = promo.rate * 2.0  # bytes over any window T stay <= rate * T + cap + the largest file
        c.tokens = min(cap, c.tokens + promo.rate * max(0.0, dt))
        c.tokens = c.pins.take(t, c.info, now, c.tokens, cap, out)  # pinned files first
        q = c.promo_queue
        # the columns' raw arrays, read inline (thousands of promotions a tick): a size is stored plus one, a spilled
        # one (4 GiB or more) is read through the column; a device as its index
        flags, tgen, tino, tsize, devs, tdev = t.flags, t.gen, t.ino.a, t.size.a, t.dev.devs, t.dev.a
        read_size = t.size.__getitem__
        name = c.info.name
        bar = c.cached.admission_bar(t.epoch)
        items, head, end = q.items, q.head, len(q.items)
        starts, rids = q.runs()  # the reasons' runs, followed along (k: the run of the entry at head)
        k = bisect_right(starts, head) - 1
        run_end = starts[k + 1] if k + 1 < len(starts) else end
        credit = c.import_credit
        tokens = c.tokens + credit
        score = t.score
        texts: dict[int, str] = {}  # reason texts by counter: thousands of promotions share a few
        append = out.append
        not_queued = ~F_QUEUED & 0xFF
        gated = c.caps.inserts_read_misses and promo.only_uncached
        resident = F_RESIDENT if gated else 0  # a promoted file is not read again
        why = self._why_admitted(c, now) if gated else ""
        while head < end:
            at = head
            slot = items[head]
            f = flags[slot]
            if not f & F_MEMBER:
                head += 1
                flags[slot] = f & not_queued
                continue
            size = tsize[slot] - 1
            if size >= SPILLED:
                size = read_size(slot)
            if size > tokens and tokens < cap:
                break  # a file larger than the bucket goes once the bucket is full, leaving a debt
            head += 1
            flags[slot] = (f & not_queued) | resident
            tokens -= size
            while at >= run_end:
                k += 1
                run_end = starts[k + 1] if k + 1 < len(starts) else end
            rid = rids[k]
            if rid != ADMITTED:
                reason = q.reasons[rid] if rid < len(q.reasons) else "re-warm"
            elif size > promo.sieve_size:
                reason = self._why_large(slot, bar, why)
            else:
                sc = score(slot)
                known = texts.get(sc)
                if known is None:
                    known = texts[sc] = f"counter {sc} > last evicted {bar}{why}"
                reason = known
            append(Promote(name, devs[tdev[slot]], tino[slot], tgen[slot], ((0, size),), reason))
        # an imported list's credit is spent first; it lapses once the queue is empty (handoff.py)
        left = max(0.0, credit - (c.tokens + credit - tokens))
        c.tokens = tokens - left
        c.import_credit = left if head < end else 0.0
        q.head = head - 1
        q.pop()  # compacts the array when the consumed head is large

    def _why_large(self, slot: int, bar: int, why: str) -> str:
        """The reason of an admitted file of the large-file class (few: not cached by counter like the others)."""
        t = self.hotness
        return (f"large file ({t.size[slot] / (1 << 20):.1f} MiB) read whole {t.whole_reads(slot):.1f} times "
                f"below the page cache (large_files); counter {t.score(slot)} > last evicted {bar}{why}")

    @staticmethod
    def _why_admitted(c: VolumeCtl, now: int) -> str:
        """What let an admitted file through on a cache that inserts its own misses (the reason's tail)."""
        if c.bypass_rose_ns is None:
            return "; no bypass counters sampled yet"
        return f"; the cache bypassed reads {max(0, now - c.bypass_rose_ns) / NS:.0f} s ago (it keeps only its misses)"

    def rewarm(self, c: VolumeCtl, reason: str, idle_since_ns: int | None = None) -> int:
        """Queue members (hottest first); with idle_since_ns only those not accessed since then."""
        n = 0
        t = self.hotness
        last, flags = t.last, t.flags
        q = c.promo_queue
        rid = q.reason_id(reason)
        if idle_since_ns is None:
            c.pins.requeue_all(reason)
        for slot in c.cached.hottest_members():
            if idle_since_ns is not None and last[slot] >= idle_since_ns:
                continue
            f = flags[slot]
            if not f & F_QUEUED:
                flags[slot] = f | F_QUEUED
                q.push(slot, rid)
                n += 1
        return n

    def scan_pollution(self, c: VolumeCtl, now: int) -> None:
        """Two signals of a polluted cache: a scan (cold files -- outside the believed-cached set -- touched far
        faster than usual) and a falling hit ratio. A scan re-warms when it ends, if it touched enough cold bytes to
        have displaced the hot set (SCAN_POLLUTES of the cache); a hit-ratio drop re-warms at once (at most once a
        minute). Rates per second, not counts per tick: a tick that ran long (a stalled guest, a slow stage) covers
        more of the workload's usual touches and is no scan."""
        n, c.touched_now = c.touched_now, 0
        nbytes, c.touched_bytes_now = c.touched_bytes_now, 0
        last, c.scan_checked_ns = c.scan_checked_ns, now
        if last == 0 or now <= last:
            return
        rate, base = n * NS / (now - last), c.touched_baseline
        if not c.scanning:
            if base >= SCAN_MIN_BASE and rate > SCAN_START * base:
                c.scanning, c.scan_bytes = True, nbytes
            else:
                c.touched_baseline = rate if base == 0 else 0.9 * base + 0.1 * rate
        elif rate < SCAN_END * base:
            c.scanning = False
            if self._scan_polluted(c):
                c.last_rewarm_ns = now
                self.rewarm(c, f"scan ended ({rate:.0f} files/s, usual {base:.0f}; "
                               f"{c.scan_bytes >> 20} MiB cold): re-warming the hot set")
            return
        else:
            c.scan_bytes += nbytes
        drop = c.state.hit_trend()
        if not c.promotes or c.scanning or drop >= -c.policy.health.scan_drop:
            return
        if c.last_rewarm_ns is not None and now - c.last_rewarm_ns < 60 * NS:
            return
        c.last_rewarm_ns = now
        self.rewarm(c, f"hit ratio fell by {-drop:.0%}: re-warming after pollution")

    @staticmethod
    def _scan_polluted(c: VolumeCtl) -> bool:
        """Whether a scan that ended touched enough cold bytes to have pushed the hot set out: a scan smaller than
        SCAN_POLLUTES of the cache leaves an LRU-like cache's recently used (hot) data in place, and re-reading the
        whole believed-cached set after it costs reads and CPU for nothing (the kind's size unknown: any scan)."""
        if not c.promotes:
            return False
        return c.info.cache_bytes <= 0 or c.scan_bytes >= SCAN_POLLUTES * c.info.cache_bytes

    def replaced(self, c: VolumeCtl, cache_id: str, now: int) -> None:
        """A new cache device behind the volume starts empty: re-warm the believed-cached set at once, hottest
        first, instead of waiting for the workload's misses (the stock cache's only way back)."""
        if not cache_id:
            if c.cache_seen and not c.detached:  # detached: bcache drops a detached device's cached data
                c.detached = True
                self._forget_resident(c)
            return  # detached, or the kind does not say
        c.detached = False
        old, c.cache_seen = c.cache_seen, cache_id
        if old and old != cache_id:
            self._forget_resident(c)
        if old and old != cache_id and c.promotes:
            c.last_rewarm_ns = now
            self.rewarm(c, f"cache device replaced ({old[:8]} -> {cache_id[:8]}): re-warming the hot set")

    def _forget_resident(self, c: VolumeCtl) -> None:
        """A different (or re-attached) cache holds none of the volume's files: nothing is resident any more."""
        t = self.hotness
        flags = np.frombuffer(t.flags, dtype=np.uint8)
        flags[t.dev_mask(c.info.dev)] &= ~F_RESIDENT & 0xFF
        del flags
        c.bypass_wait.clear()  # the re-warm queues every member
