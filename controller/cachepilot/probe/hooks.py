"""The one table of the kernel half's programs and maps, read by both capture paths: the CO-RE loader
(probe/loader.py) and the bcc build (probe/bccload.py).

A program is declared once, as a `Hook`: the feature it provides, the tracepoint it attaches to (the object's section;
the bcc build's attachment), whether the probe is useless without it, the kfunc or module it needs, and whether the
bcc build has it. A map is declared once, as a `MapDef`: whether user space binds it by name, and the number the bcc
source knows it by. Everything else here is a view of those two tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachepilot.capabilities import CAPABILITIES


@dataclass(frozen=True)
class Hook:
    """One program of the object. ``tracepoint``: a raw (tp_btf) tracepoint's name, or CATEGORY/NAME for a classic
    one (the object's section without its tp_btf/ or tracepoint/ prefix; tests/bpf/test_layout.py checks it)."""

    program: str
    feature: str
    tracepoint: str
    required: bool = False
    kfunc: str = ""  # a kernel function the program calls (the kernel must export it to BPF)
    bcc: bool = True  # in the bcc build (kernels without BTF): False for what needs BTF (docs/kernel.md)
    module: str = ""  # the module whose tracepoint it is: absent while the module is not loaded, no failure

    @property
    def classic(self) -> bool:
        """A classic tracepoint (CATEGORY/NAME: perf events), else a raw one."""
        return "/" in self.tracepoint


BLOCK_IO = "block I/O: hotness, metadata bucket, epochs, block barriers, discards"
BCACHE_ALLOC_FAIL = "on_bcache_alloc_fail"
# the refused read-miss inserts come from the module the kind that has them declares (capabilities.ReadyReserve)
_ALLOC_FAIL_MODULE = next(c.ready_reserve.module for c in CAPABILITIES.values() if c.ready_reserve)
_DIO_CALLS = ("read", "write", "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2")
_SYNC_CALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs")


def _syscall(name: str, exit_: bool) -> str:
    return f"syscalls/sys_{'exit' if exit_ else 'enter'}_{name}"


# Every program of the object, the feature it provides, and whether the probe is useless without it (a required
# feature needs one of its programs: the block I/O hook comes in two variants, see bpf/core_fixes.bpf.h). The order
# is the bcc build's (its compile cache's key hashes the programs in this order).
HOOKS: tuple[Hook, ...] = (
    Hook("on_bio_queue", BLOCK_IO, "block_bio_queue", required=True, kfunc="bpf_rdonly_cast", bcc=False),
    Hook("on_bio_queue_compat", BLOCK_IO, "block_bio_queue", required=True),
    Hook("on_bio_split", "split bios count per piece", "block_split"),
    Hook("on_ext4_free_blocks", "freed extents (ext4)", "ext4_free_blocks"),
    Hook("on_xfs_extent_free", "freed extents (xfs)", "xfs_extent_free_defer", bcc=False),
    Hook("on_ext4_evict", "deletes: a file's end (ext4)", "ext4_evict_inode"),
    Hook("on_jbd2_end_commit", "journal commits (jbd2)", "jbd2_end_commit"),
    *(Hook(f"on_ext4_sync_{e}", "durability points: sync writes, msync, io_uring and overlayfs fsync (ext4)",
           f"ext4_sync_file_{e}") for e in ("enter", "exit")),
    Hook("on_ext4_sync_fs", "durability points: sync(2) (ext4)", "ext4_sync_fs"),
    *(Hook(f"sys_{p}{s}", f"durability calls: {s}", _syscall(s, bool(p))) for s in _SYNC_CALLS for p in ("", "exit_")),
    Hook("on_dio_begin", "direct I/O attribution (iomap)", "iomap_dio_rw_begin", bcc=False),
    Hook("on_dio_complete", "direct I/O attribution (iomap)", "iomap_dio_complete", bcc=False),
    Hook("on_dio_queued", "direct I/O attribution (iomap)", "iomap_dio_rw_queued", bcc=False),
    *(Hook(f"sys_dio_{p}{s}", "direct I/O attribution (syscalls)", _syscall(s, bool(p)))
      for s in _DIO_CALLS for p in ("", "exit_")),
    Hook(BCACHE_ALLOC_FAIL, "bcache allocation failures (read misses not inserted)", "bcache/bcache_alloc_fail",
         module=_ALLOC_FAIL_MODULE),
)
BY_PROGRAM = {h.program: h for h in HOOKS}
# the views the loader's selection and deferrals take
BIO_FAST, BIO_COMPAT = "on_bio_queue", "on_bio_queue_compat"
DIO_IOMAP = tuple(h.program for h in HOOKS if h.feature == "direct I/O attribution (iomap)")
DIO_SYSCALLS = tuple(h.program for h in HOOKS if h.program.startswith("sys_dio_"))
FSYNC_SYSCALLS = ("sys_fsync", "sys_exit_fsync", "sys_fdatasync", "sys_exit_fdatasync")
EXT4_SYNC = ("on_ext4_sync_enter", "on_ext4_sync_exit")
KFUNCS = {h.program: h.kfunc for h in HOOKS if h.kfunc}
MODULE_HOOKS = {h.program: h.module for h in HOOKS if h.module}
# the bcc build's programs and the tracepoint each attaches to
BCC_PROGRAMS = {h.program: h.tracepoint for h in HOOKS if h.bcc}


@dataclass(frozen=True)
class MapDef:
    """One map. ``bound``: a map of the CO-RE object that user space binds by name (the bcc path creates it from the
    object's definition); ``placeholder``: the number the bcc source names it by (CP_FD_<name> = PLACEHOLDER + it:
    part of a cached compile, never renumber); ``twin``: a bcc-only map taking that CO-RE map's definition."""

    name: str
    bound: bool = True
    placeholder: int | None = None
    twin: str = ""


MAP_TABLE: tuple[MapDef, ...] = (
    MapDef("watched", placeholder=0),
    MapDef("volumes", placeholder=1),
    MapDef("cp_config_map", placeholder=2),
    MapDef("drops", placeholder=3),
    MapDef("hot_slots", placeholder=4),
    MapDef("hot_claimed", placeholder=5),
    MapDef("events", placeholder=6),
    MapDef("barrier_events", placeholder=7),
    MapDef("dio_task", placeholder=13),
    MapDef("dio_store"),  # task storage: the CO-RE object's only (it needs BTF)
    MapDef("vol_drops", placeholder=8),
    MapDef("cp_ksyms", bound=False, placeholder=9),  # bcc only: kernel symbols the attribution compares (KSYMS)
    MapDef("sync_calls", placeholder=10),
    MapDef("sync_pending", placeholder=11),
    # bcc only: ext4's fsync in progress by thread id, as the syscall hooks keep theirs (task storage needs BTF)
    MapDef("sync_task", bound=False, placeholder=12, twin="sync_pending"),
    MapDef("grace"),
    MapDef("grace_inner"),
    MapDef("alloc_fails", placeholder=14),
    MapDef("deletes"),
)
# the maps user space binds on either path, by name
MAPS = tuple(m.name for m in MAP_TABLE if m.bound)
# the maps the bcc source names by placeholder (CP_FD_<name> = PLACEHOLDER + index), in that order
PLACED = tuple(m.name for m in sorted((m for m in MAP_TABLE if m.placeholder is not None),
                                      key=lambda m: m.placeholder or 0))
TWINS = {m.name: m.twin for m in MAP_TABLE if m.twin}
LOAD_FACTOR = 0.76  # slots = max_files / LOAD_FACTOR per half: (2 x 48 B + 2 bits) / 0.76 = 126.6 B of kernel memory
# per file
# the deletes map (bulk_deletes): a tick's deletes up to this many (beyond, they take the ring); 6.8 MB of kernel
# memory, preallocated (memlock measured: 104 B an entry). The cost curve's highest rate reached (bench_daemon_cost.py,
# 62 000 file events/s) made ~14 000 deletes a second.
DELETE_ENTRIES = 1 << 16


def map_sizes(nslots: int, ringbuf_bytes: int) -> dict[str, int]:
    """The maps sized at load time: the hotness table's two halves (one counted into, one drained), its claimed
    bits, the two rings."""
    return {"hot_slots": 2 * nslots, "hot_claimed": 2 * nslots // 64, "events": ringbuf_bytes,
            "barrier_events": ringbuf_bytes, "deletes": DELETE_ENTRIES}
