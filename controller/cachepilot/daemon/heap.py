"""glibc's malloc told to keep large blocks out of the heap, so the daemon's RSS is what it holds.

The engine works in numpy arrays; a tick makes and frees temporaries of a few hundred KiB to tens of MiB. glibc
serves a block above its mmap threshold (128 KiB at first) from its own mapping and unmaps it when freed, but each
such free *raises* the threshold to that block's size (up to 32 MiB): from then on blocks that large come from the
heap, whose free space is given back only from its top. With 1 M tracked files the daemon held 20-30 MiB more than
it used that way (bench_daemon_files.py: RSS 179-198 MiB; 161-165 MiB with a fixed threshold, issue 32). Setting
the threshold (and the trim threshold) fixes both and turns the raising off. 1 MiB: the tick's per-volume
temporaries (a few hundred KiB) stay in the heap, where they cost no page faults; the table-sized ones are mapped
(a tick's median CPU time unchanged; a 64 KiB threshold cost it 10 ms). Elsewhere than glibc: nothing is done.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

log = logging.getLogger("cachepilot")

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
LARGE = 1 << 20


def keep_large_blocks_mapped(threshold: int = LARGE) -> bool:
    """Set glibc's mmap and trim thresholds to ``threshold`` bytes (True if this malloc took them)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, threshold) == 1 and mallopt(M_TRIM_THRESHOLD, threshold) == 1
    if not ok:
        log.debug("mallopt refused the mmap/trim thresholds: RSS may include freed heap")
    return ok


def give_back() -> bool:
    """Return the free pages inside the heaps to the kernel (glibc malloc_trim(0): not only the top, every arena's free
    chunks of a page or more). The tick's temporaries below the mmap threshold leave such holes; with 1 M tracked files
    4 MiB of them (bench_daemon_files.py, issue 32). It walks the free lists, 0.7 ms with a 30 MiB heap: the daemon
    calls it at the end of each tick (stage ``heap``). False where there is no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up once: a ctypes.CDLL(None) a tick (dlopen and the library object) cost more
    than the trim itself under the lab's TCG vCPU (18 of the heap stage's 31 py-spy samples, issue 32)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]

