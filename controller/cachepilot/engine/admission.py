"""Admission: files touched since the last tick offered to their volume's believed-cached set, and the bypass rule
that keeps a cache which inserts its own read misses (bcache) from being asked to read what it already kept."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cachepilot.engine.promoqueue import ADMITTED
from cachepilot.engine.volumectl import NS, VolumeCtl
from cachepilot.models.hotness import F_MEMBER, F_QUEUED, F_RESIDENT, HotnessTable

# bcache folds its stats counters every 300/22 s (accounting_delay, drivers/md/bcache/stats.c): a bypassed read
# shows in cache_bypass_* up to ~14 s after it happened. A rise seen within this long of a file's admission may be
# its reads; none in that time means the cache bypassed no read, so it inserted the file's misses itself.
BYPASS_WINDOW_NS = 30 * NS
NOT_A_VOLUME = 0xFFFFFFFF  # a filesystem's rank when it is not a volume's
MASKED_GROUPS = 64  # up to this many volumes in one admission, each picked out by a mask (a pass over the slots)
MAX_BYPASS_WAIT = 1 << 16  # admitted files waiting on the bypass rule (beyond: the oldest taken as inserted)
SKIP_RESIDENT = "resident: promoted (or inserted by the cache) since the cache last changed, not written since"
SKIP_INSERTED = "inserted by the cache itself: no read bypassed within 30 s of its admission"
BYPASSED_LATER = "admitted, and the cache bypassed reads within 30 s of its admission (it did not keep them)"
LEFT_TO_POLICY = "left to the cache's policy: it promotes hot blocks from the workload's own read misses"


class Admission:
    """Queues newly admitted files for promotion (per volume, vectorised), gated by the bypass rule."""

    def __init__(self, hotness: HotnessTable, vols: dict[int, VolumeCtl]) -> None:
        self.hotness = hotness
        self.vols = vols  # the engine's, shared

    def admit(self, t: HotnessTable, now: int) -> None:
        """Offer every file touched since the last tick to its volume's believed-cached set, one vectorised pass
        per volume (1 M files in one tick must not cost a Python loop)."""
        slots = t.drain_touched_array()
        if not len(slots):
            return
        for g in self._by_volume(t, slots):
            c = self.vols.get(int(t.dev[int(g[0])]))
            if c is not None:
                self._admit_volume(c, g, now)

    def _by_volume(self, t: HotnessTable, slots: np.ndarray) -> Iterator[np.ndarray]:
        """The slots of each volume, in the order of the volumes' devices, each in the order touched. A first tick
        admits a million files at once: the keys come from a table a filesystem long (u16 ids, not an int64 search
        of every file), and with few volumes each group is picked out by a mask rather than by sorting every file
        (an argsort and a sorted copy: 16 MiB more); the daemon's RSS peaked 30 MiB above its steady size there
        (issue 32). Both ways give the same groups in the same order."""
        ids = t.dev.ids(slots)  # u16: the table's index of each file's filesystem
        if ids.min() == ids.max():
            yield slots
            return
        known = sorted(self.vols)
        rank = {dev: i for i, dev in enumerate(known)}
        lut = np.array([rank.get(dev, NOT_A_VOLUME) for dev in t.dev.devs], dtype=np.uint32)
        key = lut[ids]
        del ids
        mine = key != NOT_A_VOLUME  # files of filesystems that are not volumes are not offered
        if not mine.all():
            slots, key = slots[mine], key[mine]
        del mine
        present = np.flatnonzero(np.bincount(key, minlength=len(known))) if len(key) else key
        if len(present) <= MASKED_GROUPS:
            for k in present.tolist():
                yield slots[key == k]
            return
        small = key.astype(np.uint16 if len(known) < 65536 else np.uint32)  # radix sort (stable): ~10x faster
        del key
        order = np.argsort(small, kind="stable")
        cuts = np.flatnonzero(np.diff(small[order])) + 1
        yield from np.split(slots[order], cuts)

    def _admit_volume(self, c: VolumeCtl, s: np.ndarray, now: int) -> None:
        """Sieve (size, write-only, append-only; see HotnessTable.sieve), re-charge members, admit the rest against
        the last evicted counter; queue the new members for promotion in the order they were touched."""
        t = self.hotness
        s = c.pins.exclude(s)  # pinned files are not sieved nor admitted: models/pins.py
        f = np.frombuffer(t.flags, dtype=np.uint8)[s]
        member = (f & F_MEMBER) != 0
        size = t.size.take(s)
        c.touched_now += len(s) - int(member.sum())
        c.touched_bytes_now += int(size[~member].sum())
        promo = c.policy.promotion
        if not c.promotes:
            return
        ok = t.sieve_mask(s, *promo.sieve_args)
        c.cached.discard_many(s[member & ~ok])  # e.g. it grew past the sieve: invalidate
        keep = member & ok
        if keep.any():
            c.cached.recharge(s[keep], size[keep])
        cand = ~member & ok
        admitted = c.cached.admit_many(s[cand], size[cand])
        if len(admitted):
            flags = np.frombuffer(t.flags, dtype=np.uint8)
            fresh = admitted[(flags[admitted] & F_QUEUED) == 0]
            if c.caps.promotes_own_misses and promo.only_uncached:
                self._skipped(c, LEFT_TO_POLICY, len(fresh))  # members still: re-warms and exports see them
                return
            if c.caps.inserts_read_misses and promo.only_uncached:
                fresh = self._gate_inserted(c, fresh, flags, now)
            flags[fresh] |= F_QUEUED
            del flags
            c.promo_queue.push_many(fresh, ADMITTED)

    def _gate_inserted(self, c: VolumeCtl, slots: np.ndarray, flags: np.ndarray, now: int) -> np.ndarray:
        """On a cache that inserts its own read misses (bcache: readahead and O_DIRECT ones too), the newly
        admitted files worth a promotion read now: a file already resident is never promoted again (until a write
        or a cache change); the others only while the cache has been bypassing reads (its bypass count rose within
        BYPASS_WINDOW_NS) -- else they wait for a rise within that window of their admission (bypass_gate).
        Without bypass counters (none sampled yet) only the residency rule applies."""
        resident = (flags[slots] & F_RESIDENT) != 0
        if resident.any():
            self._skipped(c, SKIP_RESIDENT, int(resident.sum()))
            slots = slots[~resident]
        rose = c.bypass_rose_ns
        if c.bypasses_seen is None or (rose is not None and now - rose <= BYPASS_WINDOW_NS):
            return slots
        gen = self.hotness.gen
        c.bypass_wait.extend((s, gen[s], now) for s in slots.tolist())
        over = len(c.bypass_wait) - MAX_BYPASS_WAIT
        if over > 0:
            for _ in range(over):
                c.bypass_wait.popleft()
            self._skipped(c, SKIP_INSERTED, over)
        return slots[:0]

    def bypass_gate(self, c: VolumeCtl, now: int) -> None:
        """Admitted files that waited on the bypass rule: promoted if the cache's bypass count rose within
        BYPASS_WINDOW_NS of their admission; once that window is over without one, taken as inserted by the cache
        (resident). Oldest first: a file not yet decided means no later one is."""
        w = c.bypass_wait
        rose = c.bypass_rose_ns
        t = self.hotness
        flags, gen = t.flags, t.gen
        rid = -1
        while w:
            slot, g, at = w[0]
            alive = gen[slot] == g and flags[slot] & F_MEMBER
            if rose is not None and at - BYPASS_WINDOW_NS <= rose <= at + BYPASS_WINDOW_NS:
                if alive and not flags[slot] & F_QUEUED:
                    rid = c.promo_queue.reason_id(BYPASSED_LATER) if rid < 0 else rid
                    flags[slot] |= F_QUEUED
                    c.promo_queue.push(slot, rid)
            elif now - at > BYPASS_WINDOW_NS:
                if alive:
                    flags[slot] |= F_RESIDENT
                self._skipped(c, SKIP_INSERTED, 1)
            else:
                break
            w.popleft()

    @staticmethod
    def _skipped(c: VolumeCtl, reason: str, n: int) -> None:
        c.promotions_skipped[reason] = c.promotions_skipped.get(reason, 0) + n
