"""Turn a file-level workload into a block access stream and the controller's event stream.

Files get 4 KiB blocks from a simple allocator: fresh space while the filesystem has it, then
first-in-first-out reuse of freed extents (a freed block is not reused at once, like a filesystem that
cannot reuse blocks before the journal commit and spreads allocations).
The stream is a set of parallel arrays; every tick (1 s of simulated time) also carries the events the
probe reports, in the shape the kernel half delivers them: Delete and FreedExtent (tagged with the running
journal transaction), a JournalCommit every ``commit_interval_s`` and at every fsync (ext4 commits the
running transaction to make an fsync durable), the block barrier of that commit (PREFLUSH|FUA, closing
the epoch, with the epoch's data/metadata bytes), and at the end of the tick the drain: per-file
HotnessDelta and the file-level durability calls counted per kind (SyncCalls).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from cachepilot.events import (
    Barrier,
    BarrierKind,
    Delete,
    Event,
    FileKey,
    FreedExtent,
    HotnessDelta,
    JournalCommit,
    SyncCalls,
    kdev,
)
from cachepilot.models.hotness import inverse_bitmap_score
from cachepilot.workloads import (
    APPEND,
    CREATE,
    DELETE,
    DROP_CACHE,
    FSYNC,
    READ,
    WRITE,
    Workload,
)

BLOCK = 4096
K_READ, K_WRITE, K_FREE, K_DROP = 0, 1, 2, 3
SIM_DEV = kdev(252, 0)
MAX_REQ = 128 * 1024  # requests are split like readahead / writeback would: at most 128 KiB
SIM_PID = 4242  # the workload's process
COMMIT_META_BYTES = 3 * BLOCK  # a small journal transaction: descriptor, one metadata block, commit block


@dataclass
class Prepared:
    workload: Workload
    blk: array = field(default_factory=lambda: array("I"))
    kind: array = field(default_factory=lambda: array("B"))
    tag: array = field(default_factory=lambda: array("B"))
    tick_end: list[int] = field(default_factory=list)  # stream index where each tick ends
    tick_events: list[list[Event]] = field(default_factory=list)
    tick_files: list[dict[int, tuple[int, ...] | None]] = field(default_factory=list)  # fid -> blocks
    volume_blocks: int = 0
    data_blocks_peak: int = 0
    tick_ns: int = 1_000_000_000

    def ino(self, fid: int) -> int:
        return fid + 12

    def fid(self, ino: int) -> int:
        return ino - 12


class _Alloc:
    """Fresh space first (a filesystem much larger than its live data rarely reuses a just-freed block);
    once ``fs_blocks`` are in use, freed extents are reused oldest first."""

    def __init__(self, fs_blocks: int) -> None:
        self.free: deque[tuple[int, int]] = deque()
        self.top = 0
        self.used = 0
        self.fs_blocks = fs_blocks

    def alloc(self, n: int) -> list[int]:
        out: list[int] = []
        self.used += n
        while n and self.free and self.top + n > self.fs_blocks:
            s, c = self.free.popleft()
            take = min(c, n)
            out.extend(range(s, s + take))
            if take < c:
                self.free.appendleft((s + take, c - take))
            n -= take
        if n:
            out.extend(range(self.top, self.top + n))
            self.top += n
        return out

    def release(self, blocks: list[int]) -> list[tuple[int, int]]:
        """Free blocks; returns them as extents."""
        self.used -= len(blocks)
        ext: list[tuple[int, int]] = []
        for b in sorted(blocks):
            if ext and ext[-1][0] + ext[-1][1] == b:
                ext[-1] = (ext[-1][0], ext[-1][1] + 1)
            else:
                ext.append((b, 1))
        self.free.extend(ext)
        return ext


def prepare(w: Workload, commit_interval_s: float = 5.0, fs_blocks: int = 1 << 31,
            tick_s: float = 1.0) -> Prepared:
    p = Prepared(w, tick_ns=int(tick_s * 1e9))
    pr = _Preparer(p, _Alloc(fs_blocks), max(1, int(commit_interval_s * 1e9 // p.tick_ns)))
    ops_per_tick = max(1, p.tick_ns // w.op_interval_ns)
    do = {READ: pr.read, WRITE: pr.write, APPEND: pr.write, CREATE: pr.create, DELETE: pr.delete,
          FSYNC: pr.fsync, DROP_CACHE: pr.drop_cache}
    tick = 0
    for i, (op, fid, off, length, tg) in enumerate(w.ops):
        if i and i % ops_per_tick == 0:
            pr.end_tick(tick)
            tick += 1
        one = do.get(op)
        if one is not None:
            one(fid, off, length, tg, i * w.op_interval_ns)
        p.data_blocks_peak = max(p.data_blocks_peak, pr.al.used)
    pr.end_tick(tick)
    p.volume_blocks = pr.al.top
    return p


class _Preparer:
    """Turns a workload's file operations into block operations and the events the kernel would emit, tick by
    tick (one method per operation)."""

    def __init__(self, p: Prepared, al: _Alloc, commit_every: int) -> None:
        self.p, self.al, self.commit_every = p, al, commit_every
        self.files: dict[int, list[int]] = {}
        self.sizes: dict[int, int] = {}
        self.hot: dict[int, list[int]] = {}  # fid -> [rs, ws, rb, wb, last_ns]
        self.events: list[Event] = []
        self.changed: dict[int, tuple[int, ...] | None] = {}
        self.epoch_data = 0
        self.syncs: list[int] = [0, 0, 0]  # fsync calls this tick, last ino, last ts
        self.tid = 1  # the running journal transaction
        self.dev = SIM_DEV

    def _blocks(self, blocks: Iterable[int], k: int, tg: int) -> None:
        p = self.p
        for b in blocks:
            p.blk.append(b)
            p.kind.append(k)
            p.tag.append(tg)

    def commit(self, ts: int, flush: bool) -> None:
        """Commit the running transaction; an fsync's commit is also the barrier that closes the epoch."""
        self.events.append(JournalCommit(self.dev, self.tid, ts))
        self.tid += 1
        if flush:
            d = self.epoch_data
            self.events.append(Barrier(self.dev, BarrierKind.PREFLUSH, 0, 0, d + COMMIT_META_BYTES, ts,
                                       d, COMMIT_META_BYTES, flags=3, arg=BLOCK, closes_epoch=True))
            self.epoch_data = 0

    def account(self, fid: int, nbytes: int, write: bool, ts: int) -> None:
        h = self.hot.get(fid)
        if h is None:
            h = self.hot[fid] = [0, 0, 0, 0, 0]
        off = 0
        while off < nbytes:
            chunk = min(MAX_REQ, nbytes - off)
            h[1 if write else 0] += inverse_bitmap_score(chunk)
            off += chunk
        h[3 if write else 2] += nbytes
        h[4] = ts

    def end_tick(self, k: int) -> None:
        p, dev = self.p, self.dev
        ts = (k + 1) * p.tick_ns
        for fid, (rs, ws, rb, wb, last) in self.hot.items():
            self.events.append(HotnessDelta(FileKey(dev, p.ino(fid), 1), rs, ws, rb, wb, last,
                                            self.sizes.get(fid, -1)))
        self.hot.clear()
        if self.syncs[0]:
            self.events.append(SyncCalls(dev, BarrierKind.FSYNC, self.syncs[0], SIM_PID, p.ino(self.syncs[1]),
                                         self.syncs[2]))
            self.syncs[0] = 0
        if (k + 1) % self.commit_every == 0:
            self.commit(ts, flush=True)  # jbd2's periodic commit flushes too
        p.tick_events.append(list(self.events))
        self.events.clear()
        p.tick_files.append(dict(self.changed))
        self.changed.clear()
        p.tick_end.append(len(p.blk))

    def read(self, fid: int, off: int, length: int, tg: int, ts: int) -> None:
        blocks = self.files.get(fid)
        if not blocks:
            return
        last = min(len(blocks), (off + length + BLOCK - 1) // BLOCK)
        self._blocks(blocks[off // BLOCK:last], K_READ, tg)
        self.account(fid, length, False, ts)

    def write(self, fid: int, off: int, length: int, tg: int, ts: int) -> None:
        blocks = self.files.setdefault(fid, [])
        need = (off + length + BLOCK - 1) // BLOCK
        if need > len(blocks):
            blocks.extend(self.al.alloc(need - len(blocks)))
        self._blocks(blocks[off // BLOCK:need], K_WRITE, tg)
        self.sizes[fid] = max(self.sizes.get(fid, 0), off + length)
        self.account(fid, length, True, ts)
        self.epoch_data += length
        self.changed[fid] = tuple(blocks)

    def create(self, fid: int, off: int, length: int, tg: int, ts: int) -> None:
        self.files.setdefault(fid, [])
        self.sizes[fid] = 0

    def delete(self, fid: int, off: int, length: int, tg: int, ts: int) -> None:
        blocks = self.files.pop(fid, [])
        size = self.sizes.pop(fid, 0)
        self.hot.pop(fid, None)
        self._blocks(blocks, K_FREE, 0)
        ino = self.p.ino(fid)
        self.events.append(Delete(FileKey(self.dev, ino, 1), size, ts))
        for s, c in self.al.release(blocks):
            self.events.append(FreedExtent(self.dev, ino, s, c, False, ts, self.tid))
        self.changed[fid] = None

    def fsync(self, fid: int, off: int, length: int, tg: int, ts: int) -> None:
        self.syncs[0] += 1
        self.syncs[1], self.syncs[2] = fid, ts
        self.commit(ts, flush=True)

    def drop_cache(self, fid: int, off: int, length: int, tg: int, ts: int) -> None:
        self._blocks((0,), K_DROP, 0)
