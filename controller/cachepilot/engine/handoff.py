"""A warm handoff's imported hot list into a volume's promotion queue (``cachepilot hotlist import``).

Each file goes into the hotness table with the counter it had on the exporting host (read-hot, of known size), is
offered to the believed-cached set like any admitted file (sieve and admission bar as usual; pinned files are left to
their pins), and the admitted ones are queued hottest first with the reason "imported hot list". Unlike an ordinary
admission they skip the bcache bypass rule (``only_uncached``): the operator asked for them because the cache does not
hold them (a new cache device, another host). Nor do they wait for the volume's promotion rate here: their bytes are a
credit the queue spends first, so they leave it at once, hottest first, and the promoter reads them at
``IMPORT_RATE_FACTOR`` times the rate, backing off on bcache's allocation failures (actuators/promote.py). Measured in
the lab (dm-cache, origin +20 ms): at the policy's rate, read one file at a time, the re-warm placed ~7 files of
64 KiB a second and a fresh cache recovered no sooner with the import than by its own misses (14 s vs 16 s).
Nor are they cut to the policy's ``max_cache_fraction``: that share bounds what the daemon promotes on its own
guesses, so that they never take over a cache the kernel's policy fills from the workload; an imported list is the
operator's request, typically for a fresh cache where it displaces nothing, and in the lab the share cut a list of
~900 files to ~256. So the import lends the believed-cached set room for the list, up to the whole cache less
pinned files (a longer list keeps its hottest files that fit), until ``LOAN_NS`` after the import's last request;
then the set goes back to its share (shedding its coldest members: bookkeeping only, the cache keeps them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from cachepilot.actions import IMPORTED
from cachepilot.models.hotness import F_MEMBER, F_QUEUED, F_READ, F_RESIDENT, PAGE, HotnessTable

if TYPE_CHECKING:
    from cachepilot.engine.volumectl import VolumeCtl

__all__ = ["IMPORTED", "end_loan", "queue_imported"]

LOAN_NS = 30_000_000_000


def queue_imported(c: VolumeCtl, t: HotnessTable, now: int,
                   files: Sequence[tuple[int, int, int, int]]) -> tuple[int, int]:
    """(queued, not queued: sieved, below the admission bar, already queued or resident) for files (ino, gen,
    score, size), hottest first, of the volume ``c`` (its files in the hotness table ``t``)."""
    slots = []
    for ino, gen, score, size in files:
        slot = t.update(c.info.dev, ino, gen, score, 0, 0, now, size)
        t.flags[slot] |= F_READ
        slots.append(slot)
    arr = c.pins.exclude(np.unique(np.array(slots, dtype=np.int64)))
    if not len(arr) or not c.promotes:
        return 0, len(arr)
    ok = arr[t.sieve_mask(arr, *c.policy.promotion.sieve_args)]
    flags = np.frombuffer(t.flags, dtype=np.uint8)
    member = (flags[ok] & F_MEMBER) != 0
    known = ok[member & ((flags[ok] & F_RESIDENT) == 0)]  # members the cache is not known to hold
    del flags
    sizes = t.size.take(ok[~member])
    _lend_room(c, int(((sizes + PAGE - 1) // PAGE).sum()) * PAGE, now)
    admitted = c.cached.admit_many(ok[~member], sizes)
    admitted = np.concatenate([admitted, known])
    flags = np.frombuffer(t.flags, dtype=np.uint8)
    fresh = admitted[(flags[admitted] & F_QUEUED) == 0]
    flags[fresh] |= F_QUEUED
    del flags
    fresh = fresh[np.argsort([-t.score(x) for x in fresh.tolist()], kind="stable")]  # hottest first
    c.promo_queue.push_many(fresh, c.promo_queue.reason_id(IMPORTED))
    c.import_credit += float(t.size.take(fresh).sum())
    return len(fresh), len(arr) - len(fresh)


def _lend_room(c: VolumeCtl, nbytes: int, now: int) -> None:
    """Room in the believed-cached set for ``nbytes`` of imported files past its ``max_cache_fraction`` share, up
    to the whole cache less pinned files, until ``LOAN_NS`` after the last request of the import (its requests
    come a few seconds apart at most; one loan for all of them keeps the list's total within the cache)."""
    c.import_room += nbytes
    c.import_last_ns = now
    c.cached.capacity_bytes = c.set_room()


def end_loan(c: VolumeCtl, now: int) -> None:
    """The set back to its share once the import is over: it sheds its coldest members at the next admission
    (bookkeeping only: the imported files were handed to the promoter at once, and the cache keeps them)."""
    if c.import_room and now - c.import_last_ns >= LOAN_NS:
        c.import_room = 0
        c.cached.capacity_bytes = c.set_room()
