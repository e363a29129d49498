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
    blk, kind, tag = p.blk, p.kind, p.tag
    al = _Alloc(fs_blocks)
    files: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}
    ops_per_tick = max(1, p.tick_ns // w.op_interval_ns)
    commit_every = max(1, int(commit_interval_s * 1e9 // p.tick_ns))
    hot: dict[int, list[int]] = {}  # fid -> [rs, ws, rb, wb, last_ns]
    events: list[Event] = []
    changed: dict[int, tuple[int, ...] | None] = {}
    epoch_data = 0
    syncs: list[int] = [0, 0, 0]  # fsync calls this tick, last ino, last ts
    tid = 1  # the running journal transaction
    dev = SIM_DEV

    def commit(ts: int, flush: bool) -> None:
        """Commit the running transaction; an fsync's commit is also the barrier that closes the epoch."""
        nonlocal tid, epoch_data
        events.append(JournalCommit(dev, tid, ts))
        tid += 1
        if flush:
            events.append(Barrier(dev, BarrierKind.PREFLUSH, 0, 0, epoch_data + COMMIT_META_BYTES, ts,
                                  epoch_data, COMMIT_META_BYTES, flags=3, arg=BLOCK, closes_epoch=True))
            epoch_data = 0

    def account(fid: int, nbytes: int, write: bool, ts: int) -> None:
        h = hot.get(fid)
        if h is None:
            h = hot[fid] = [0, 0, 0, 0, 0]
        off = 0
        while off < nbytes:
            chunk = min(MAX_REQ, nbytes - off)
            b = inverse_bitmap_score(chunk)
            h[1 if write else 0] += b
            off += chunk
        h[3 if write else 2] += nbytes
        h[4] = ts

    def end_tick(k: int) -> None:
        ts = (k + 1) * p.tick_ns
        for fid, (rs, ws, rb, wb, last) in hot.items():
            events.append(HotnessDelta(FileKey(dev, p.ino(fid), 1), rs, ws, rb, wb, last,
                                       sizes.get(fid, -1)))
        hot.clear()
        if syncs[0]:
            events.append(SyncCalls(dev, BarrierKind.FSYNC, syncs[0], SIM_PID, p.ino(syncs[1]), syncs[2]))
            syncs[0] = 0
        if (k + 1) % commit_every == 0:
            commit(ts, flush=True)  # jbd2's periodic commit flushes too
        p.tick_events.append(list(events))
        events.clear()
        p.tick_files.append(dict(changed))
        changed.clear()
        p.tick_end.append(len(blk))

    tick = 0
    for i, (op, fid, off, length, tg) in enumerate(w.ops):
        ts = i * w.op_interval_ns
        if i and i % ops_per_tick == 0:
            end_tick(tick)
            tick += 1
        if op == READ:
            blocks = files.get(fid)
            if not blocks:
                continue
            first = off // BLOCK
            last = min(len(blocks), (off + length + BLOCK - 1) // BLOCK)
            for b in blocks[first:last]:
                blk.append(b)
                kind.append(K_READ)
                tag.append(tg)
            account(fid, length, False, ts)
        elif op in (WRITE, APPEND):
            blocks = files.setdefault(fid, [])
            need = (off + length + BLOCK - 1) // BLOCK
            if need > len(blocks):
                blocks.extend(al.alloc(need - len(blocks)))
            for b in blocks[off // BLOCK:need]:
                blk.append(b)
                kind.append(K_WRITE)
                tag.append(tg)
            sizes[fid] = max(sizes.get(fid, 0), off + length)
            account(fid, length, True, ts)
            epoch_data += length
            changed[fid] = tuple(blocks)
        elif op == CREATE:
            files.setdefault(fid, [])
            sizes[fid] = 0
        elif op == DELETE:
            blocks = files.pop(fid, [])
            size = sizes.pop(fid, 0)
            hot.pop(fid, None)
            for b in blocks:
                blk.append(b)
                kind.append(K_FREE)
                tag.append(0)
            events.append(Delete(FileKey(dev, p.ino(fid), 1), size, ts))
            for s, c in al.release(blocks):
                events.append(FreedExtent(dev, p.ino(fid), s, c, False, ts, tid))
            changed[fid] = None
        elif op == FSYNC:
            syncs[0] += 1
            syncs[1], syncs[2] = fid, ts
            commit(ts, flush=True)
        elif op == DROP_CACHE:
            blk.append(0)
            kind.append(K_DROP)
            tag.append(0)
        p.data_blocks_peak = max(p.data_blocks_peak, al.used)
    end_tick(tick)
    p.volume_blocks = al.top
    return p
