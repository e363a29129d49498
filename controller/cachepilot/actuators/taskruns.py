"""bcache's run history is per task, and a new thread starts with its creator's: a promotion reader sheds it first.

check_should_bypass (drivers/md/bcache/request.c) bypasses a bio when ``max(task->sequential_io,
task->sequential_io_avg) >= sequential_cutoff``: the current run's length, or the task's EWMA of its past runs, folded
in (``avg = (7 * avg + run) / 8``, add_sequential) each time the task starts a new run. copy_process
(kernel/fork.c) zeroes both fields only ``#ifdef CONFIG_BCACHE``, while include/linux/sched.h declares them for
``CONFIG_BCACHE_MODULE`` too: where bcache is a module (Debian: CONFIG_BCACHE=m) a new thread or process starts with
the average of the task that created it. A daemon started by a shell or script that had just written or read a few
hundred MiB through bcache hands that average to its reader threads, and their first promotion reads are bypassed --
measured in the lab (6.1, issue 37): the first 17 of a 16 MiB file's 103 chunks (2.37 MiB, 8-256 KiB each, none
continuing any run) bypassed as sequential, every later one admitted; a freshly started ``dd`` had even its first
4 KiB read bypassed.

Each read that starts a new run multiplies the average by 7/8, and nothing else lowers it (no interface resets it).
So a thread's first promotion read is preceded by SHED_READS reads of one block, each a new run (a read at X never
starts where the one before it ended, X + one block): 64 of them take the largest average the field holds (4 GiB)
below 1 MiB. They cost the origin at most 64 small reads, once per thread.
"""

from __future__ import annotations

import mmap
import os
import threading

SHED_READS = 64  # (7/8)^64 < 2^-12: 4 GiB (the unsigned field's largest) to below 1 MiB
SHED_BYTES = 4096

_done = threading.local()


def shed_run_history(fd: int, buf: mmap.mmap, offset: int) -> bool:
    """On this thread's first call: read SHED_BYTES at ``offset`` of ``fd`` (O_DIRECT, fs-block aligned; ``buf``
    page-aligned) SHED_READS times. True if it read (the first call on the thread)."""
    if getattr(_done, "shed", False):
        return False
    view = memoryview(buf)[:SHED_BYTES]
    for _ in range(SHED_READS):
        os.preadv(fd, [view], offset)
    _done.shed = True
    return True
