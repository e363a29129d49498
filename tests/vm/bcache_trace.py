"""bcache's own account of a lab phase, from its tracepoints through tracefs (guest scripts; root, no BPF).

What a phase's counters (stats_total) cannot say: *whose* bios bcache sent around the cache as sequential and why,
and how many read-miss inserts it refused. check_should_bypass (drivers/md/bcache/request.c) keeps the last 128 runs
hashed by end sector, each remembered 5 s past its last bio (``i->jiffies = jiffies + msecs_to_jiffies(5000)``); a
bio starting where one ended within that time continues it whoever issued it, and the task's own EWMA of its run
lengths (``sequential_io_avg``, folded in by add_sequential each time it starts a new run) counts as well: a bio is
bypassed once ``max(run, avg) >= sequential_cutoff``. Traced here:

* ``block:block_bio_queue`` on the bcache device: every bio, its sector, size and submitting task (``comm-pid``);
* ``bcache:bcache_bypass_sequential``: each bio bypassed as sequential (its sector shifted by the backing device's
  data offset: cached_dev_submit_bio remaps the bio before check_should_bypass);
* ``bcache:bcache_alloc_fail``: each read-miss insert refused for want of a ready bucket (bch_bucket_alloc, wait
  false).

``explain_bypasses`` matches each bypassed bio with the bio that ended where it started within the run memory: a
continuation (of whose run), or none (the task's EWMA carried it past the cutoff)."""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tracefs import Traced, TraceInstance

RUN_MEMORY_S = 5.0  # check_should_bypass: msecs_to_jiffies(5000)
QUEUE, BYPASS, ALLOC_FAIL = "block_bio_queue", "bcache_bypass_sequential", "bcache_alloc_fail"
EVENTS = {QUEUE: "block/block_bio_queue", BYPASS: "bcache/bcache_bypass_sequential",
          ALLOC_FAIL: "bcache/bcache_alloc_fail"}
# "  comm-pid  [cpu] flags  ts: event: rest" (the flags column depends on the trace options: optional)
LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[\d+\]\s+(?:\S+\s+)?(?P<ts>\d+\.\d+): "
                  r"(?P<event>\w+): (?P<rest>.*)$")
# bcache's own events print two spaces after the device ("%d,%d  %s %llu + %u"), the block layer's one
BIO = re.compile(r"^(?P<major>\d+),(?P<minor>\d+)\s+(?P<rwbs>\S+)\s+(?P<sector>\d+)\s+\+\s+(?P<n>\d+)")


@dataclass(frozen=True)
class Rec:
    event: str
    comm: str
    pid: int
    ts: float
    dev: str = ""  # "major,minor"
    rwbs: str = ""
    sector: int = 0
    sectors: int = 0


def parse(text: str) -> list[Rec]:
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        b = BIO.match(m["rest"])
        out.append(Rec(m["event"], m["comm"].strip(), int(m["pid"]), float(m["ts"]),
                       *((f"{b['major']},{b['minor']}", b["rwbs"], int(b["sector"]), int(b["n"])) if b else ())))
    return out


class Trace(Traced):
    """Events on from ``start`` to ``stop`` (the records then), in a trace instance of their own (tracefs.py): a new
    one at each start, so its buffer starts empty; removed at ``stop``, or on leaving a ``with`` block."""

    def __init__(self, events: tuple[str, ...] = (QUEUE, BYPASS, ALLOC_FAIL), buffer_kb: int = 4096) -> None:
        self.trace = TraceInstance(f"cp-bcache-{os.getpid()}", {EVENTS[e]: "" for e in events}, buffer_kb=buffer_kb)

    def start(self) -> None:
        self.trace.close()
        self.trace.open()

    def stop(self) -> list[Rec]:
        self.trace.disable()
        recs = parse(self.trace.text())
        self.trace.close()
        return recs

    def take(self) -> list[Rec]:
        """The records so far, the buffer cleared (events stay on): a round's share."""
        recs = parse(self.trace.text())
        self.trace.clear()
        return recs


def devno(block: str) -> str:
    """``"major,minor"`` of /dev/<block> as trace lines print it."""
    return (Path("/sys/block") / block / "dev").read_text().strip().replace(":", ",")


def explain_bypasses(recs: list[Rec], bcache_dev: str, who: str) -> dict[str, object]:
    """The bios of tasks whose comm starts with ``who`` that bcache bypassed as sequential, each matched with the
    bio on the bcache device that ended where it started within the run memory (any task's)."""
    queued = [r for r in recs if r.event == QUEUE and r.dev == bcache_dev and r.sectors]
    bypassed = [r for r in recs if r.event == BYPASS]
    mine = [r for r in queued if r.comm.startswith(who)]
    # the bypass event's sector is the backing device's (+ data offset): find the offset that matches its bios
    offsets = Counter(b.sector - q.sector for b in bypassed for q in queued
                      if q.pid == b.pid and q.sectors == b.sectors and 0 <= b.sector - q.sector <= 1 << 16
                      and abs(q.ts - b.ts) < 0.01)
    off = offsets.most_common(1)[0][0] if offsets else 16
    ends: dict[int, list[Rec]] = {}
    for q in queued:
        ends.setdefault(q.sector + q.sectors, []).append(q)
    sources: Counter[str] = Counter()
    examples: list[str] = []
    mine_bypassed = [b for b in bypassed if b.comm.startswith(who)]
    for b in mine_bypassed:
        start = b.sector - off
        prev = [q for q in ends.get(start, []) if b.ts - RUN_MEMORY_S <= q.ts <= b.ts]
        src = max(prev, key=lambda q: q.ts) if prev else None
        key = f"{src.comm}-{'self' if src.pid == b.pid else 'other'}" if src else "none"
        sources[key] += 1
        if len(examples) < 6:
            examples.append(f"{start}+{b.sectors}@{b.ts:.3f}<-{key}" + (f"@{src.ts:.3f}" if src else ""))
    by_comm = Counter(r.comm for r in bypassed)
    return {"bios": len(mine), "bypassed": len(mine_bypassed),
            "bypassed_bytes": sum(b.sectors for b in mine_bypassed) * 512,
            "continuing": dict(sources), "examples": examples, "offset": off,
            "bypassed_by_comm": dict(by_comm), "alloc_fail": sum(1 for r in recs if r.event == ALLOC_FAIL)}


def timeline(recs: list[Rec], bcache_dev: str, offset: int, limit: int = 40) -> list[str]:
    """The bios on the bcache device in order (task, time, sector+size), each marked B if bcache bypassed it as
    sequential: what a failing lab run prints, to see whose run a bypassed bio continued."""
    bypassed = {(b.pid, b.sector - offset, b.sectors) for b in recs if b.event == BYPASS}
    out = [f"{q.ts:.4f} {q.comm}-{q.pid} {q.rwbs} {q.sector}+{q.sectors}"
           f"{' B' if (q.pid, q.sector, q.sectors) in bypassed else ''}"
           for q in recs if q.event == QUEUE and q.dev == bcache_dev and q.sectors]
    return out if len(out) <= limit else out[:limit // 2] + ["..."] + out[-limit // 2:]
