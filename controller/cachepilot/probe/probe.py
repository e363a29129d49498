"""The probe: loads bpf/cachepilot.bpf.o through the system libbpf, attaches, and turns the kernel's maps and ring
buffer into typed events (cachepilot.events).

    probe = Probe()                       # checks root, BTF, tracefs; loads and attaches; raises UserError if unusable
    probe.watch_volume(dev, lower=[...])  # kernel dev_t of the cached device (+ backing / cache devices)
    while running:
        for ev in probe.poll(timeout_ms=1000):   # discrete events: FreedExtent, Delete, Barrier, Discard, JournalCommit
            ...
        for ev in probe.drain():                 # per tick: HotnessDelta per file, MetadataDelta per volume, Drops
            ...
    probe.close()

Filtering happens in the kernel (the "watched" map): events of unwatched devices never reach user space.
"""

from __future__ import annotations

import ctypes as C
import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachepilot import bpf_layout as L
from cachepilot.capabilities import CAPABILITIES
from cachepilot.errors import UserError
from cachepilot.events import (
    Drops,
    Event,
    FileKey,
    HotnessDelta,
)
from cachepilot.mountinfo import ProcMounts
from cachepilot.probe import bccload, capture, libbpf
from cachepilot.probe.bccload import DEFAULT_CACHE as DEFAULT_BCC_CACHE
from cachepilot.probe.bccload import BccPrograms
from cachepilot.probe.counters import VolumeCounters
from cachepilot.probe.deletes import KernelDeletes
from cachepilot.probe.hottable import KernelHotTable
from cachepilot.probe.kconfig import KernelConfig
from cachepilot.probe.maps import MapAccess
from cachepilot.probe.poller import EventRings
from cachepilot.probe.watches import NOT_EXT4, STACKED, WatchTable

REPO_ROOT = Path(__file__).resolve().parents[3]
# Where the compiled object is looked for when no path is configured: the copy a wheel or the Debian package carries
# as package data (`make package` puts it there), then a checkout's build output (`make bpf`, for development).
PACKAGED_OBJECT = Path(__file__).resolve().parents[1] / "data" / "cachepilot.bpf.o"
CHECKOUT_OBJECT = REPO_ROOT / "bpf" / ".output" / "cachepilot.bpf.o"
# What the object needs (docs/install.md): the BPF ring buffer (5.8), libbpf 1.x's API, the Python of pyproject.
MIN_KERNEL = (5, 8)
MIN_LIBBPF = (1, 1)
MIN_PYTHON = (3, 11)
VMLINUX_BTF = capture.VMLINUX_BTF
TRACEFS = Path("/sys/kernel/tracing")
WORKS_WITHOUT = capture.WORKS_WITHOUT
MAPS = (
    "watched", "volumes", "cp_config_map", "drops", "hot_slots", "hot_claimed", "events", "barrier_events", "dio_task",
    "dio_store", "vol_drops", "sync_calls", "sync_pending", "grace", "grace_inner", "alloc_fails", "deletes",
)
LOAD_FACTOR = 0.76  # slots = max_files / LOAD_FACTOR per half: (2 x 48 B + 2 bits) / 0.76 = 126.6 B of kernel memory
# per file
# the deletes map (bulk_deletes): a tick's deletes up to this many (beyond, they take the ring); 6.8 MB of kernel
# memory, preallocated (memlock measured: 104 B an entry). The cost curve's highest rate reached (bench_daemon_cost.py,
# 62 000 file events/s) made ~14 000 deletes a second.
DELETE_ENTRIES = 1 << 16


@dataclass(frozen=True)
class Hook:
    program: str
    feature: str
    required: bool = False
    kfunc: str = ""  # a kernel function the program calls (the kernel must export it to BPF)


BLOCK_IO = "block I/O: hotness, metadata bucket, epochs, block barriers, discards"
BCACHE_ALLOC_FAIL = "on_bcache_alloc_fail"
# programs on a module's tracepoints: absent while the module is not loaded, which is no failure of the probe. The
# refused read-miss inserts come from the module the kind that has them declares (capabilities.ReadyReserve).
MODULE_HOOKS = {BCACHE_ALLOC_FAIL: next(c.ready_reserve.module for c in CAPABILITIES.values() if c.ready_reserve)}
# Every program of the object, the feature it provides, and whether the probe is useless without it (a required
# feature needs one of its programs: the block I/O hook comes in two variants, see bpf/core_fixes.bpf.h).
HOOKS: tuple[Hook, ...] = (
    Hook("on_bio_queue", BLOCK_IO, required=True, kfunc="bpf_rdonly_cast"),
    Hook("on_bio_queue_compat", BLOCK_IO, required=True),
    Hook("on_bio_split", "split bios count per piece"),
    Hook("on_dio_begin", "direct I/O attribution (iomap)"),
    Hook("on_dio_complete", "direct I/O attribution (iomap)"),
    Hook("on_dio_queued", "direct I/O attribution (iomap)"),
    *(
        Hook(f"sys_dio_{e}{s}", "direct I/O attribution (syscalls)")
        for s in ("read", "write", "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2")
        for e in ("", "exit_")
    ),
    Hook("on_ext4_free_blocks", "freed extents (ext4)"),
    Hook("on_ext4_evict", "deletes: a file's end (ext4)"),
    Hook("on_xfs_extent_free", "freed extents (xfs)"),
    Hook("on_jbd2_end_commit", "journal commits (jbd2)"),
    *(
        Hook(f"sys_{p}{s}", f"durability calls: {s}")
        for s in ("fsync", "fdatasync", "sync_file_range", "syncfs")
        for p in ("", "exit_")
    ),
    *(Hook(f"on_ext4_sync_{e}", "durability points: sync writes, msync, io_uring and overlayfs fsync (ext4)")
      for e in ("enter", "exit")),
    Hook("on_ext4_sync_fs", "durability points: sync(2) (ext4)"),
    Hook(BCACHE_ALLOC_FAIL, "bcache allocation failures (read misses not inserted)"),
)
DIO_IOMAP = ("on_dio_begin", "on_dio_complete", "on_dio_queued")
BIO_FAST, BIO_COMPAT = "on_bio_queue", "on_bio_queue_compat"
_KFUNCS = {h.program: h.kfunc for h in HOOKS if h.kfunc}
DIO_SYSCALLS = tuple(h.program for h in HOOKS if h.program.startswith("sys_dio_"))
FSYNC_SYSCALLS = ("sys_fsync", "sys_exit_fsync", "sys_fdatasync", "sys_exit_fdatasync")
EXT4_SYNC = ("on_ext4_sync_enter", "on_ext4_sync_exit")
DEFERRED_UNTIL = {
    STACKED: "direct I/O marks: attached when a stacked volume is watched",
    NOT_EXT4: "fsync-family system calls: attached when a filesystem other than ext4 is watched",
}


def map_sizes(nslots: int, ringbuf_bytes: int) -> dict[str, int]:
    """The maps sized at load time: the hotness table's two halves (one counted into, one drained), its claimed
    bits, the two rings."""
    return {"hot_slots": 2 * nslots, "hot_claimed": 2 * nslots // 64, "events": ringbuf_bytes,
            "barrier_events": ringbuf_bytes, "deletes": DELETE_ENTRIES}


def default_object() -> Path:
    """The packaged object if this install carries one, else the checkout's (which may not be built)."""
    return PACKAGED_OBJECT if PACKAGED_OBJECT.is_file() else CHECKOUT_OBJECT


def _release(text: str) -> tuple[int, int]:
    """(major, minor) of a kernel release string such as 6.1.0-28-amd64; (0, 0) if it has none."""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def too_old(kernel: str, python: tuple[int, ...], libbpf_version: tuple[int, int] | None) -> None:
    """UserError naming the first component older than the object needs (the kernel's release string, the
    interpreter, the system libbpf when known); nothing when all are new enough."""
    have = _release(kernel)
    if have < MIN_KERNEL:
        raise UserError(f"kernel {kernel} is too old: the probe needs {'.'.join(map(str, MIN_KERNEL))} or newer "
                        f"(BPF ring buffer, tp_btf, CO-RE); {WORKS_WITHOUT}")
    if tuple(python[:2]) < MIN_PYTHON:
        raise UserError(f"Python {'.'.join(map(str, python[:2]))} is too old: cachepilot needs "
                        f"{'.'.join(map(str, MIN_PYTHON))} or newer")
    if libbpf_version is not None and libbpf_version < MIN_LIBBPF:
        raise UserError(f"the system libbpf {'.'.join(map(str, libbpf_version))} is too old: the probe needs "
                        f"{'.'.join(map(str, MIN_LIBBPF))} or newer (Debian package libbpf1); {WORKS_WITHOUT}")


@dataclass
class AttachReport:
    """What is attached, what is not and why. A partial attach is reported here (and by `cachepilot probe`)."""

    kernel: str
    capture: str = "core"  # the capture path (probe/capture.py); for bcc, whether its compile came from the cache
    dio_hook: str = ""
    self_id: str = "not ignored"
    attached: list[str] = field(default_factory=list)
    disabled: dict[str, str] = field(default_factory=dict)  # by choice (e.g. the other direct I/O variant)
    failed: dict[str, str] = field(default_factory=dict)  # wanted but unavailable: program -> reason

    @property
    def partial(self) -> bool:
        return bool(self.failed)

    def missing_features(self) -> list[str]:
        """Features with a program that failed: a feature needs all its programs (a durability call's entry and
        exit; every read/write syscall of the direct I/O fallback)."""
        by_prog = {h.program: h.feature for h in HOOKS}
        return sorted({by_prog[p] for p in self.failed})

    def bcc(self, b: BccPrograms) -> None:
        """The bcc path: its build of the hooks (the others are the CO-RE object's only), those the kernel refused."""
        self.capture, self.dio_hook = b.describe(), bccload.DIO_HOOK
        self.failed.update(b.failed)
        self.disabled.update(dict.fromkeys((hk.program for hk in HOOKS if hk.program not in bccload.PROGRAMS),
                                           bccload.NOT_BUILT))

    def summary(self) -> str:
        lines = [
            f"kernel {self.kernel}; capture: {self.capture}; direct I/O attribution: {self.dio_hook or 'none'}; "
            f"own I/O: {self.self_id}"
        ]
        lines.append(f"attached: {', '.join(self.attached) or 'nothing'}")
        for prog, why in sorted(self.failed.items()):
            lines.append(f"NOT attached: {prog}: {why}")
        missing = self.missing_features()
        if missing:
            lines.append("missing features: " + "; ".join(missing))
        return "\n".join(lines)


def _tp_of(section: str) -> tuple[str, str]:
    kind, _, rest = section.partition("/")
    return kind, rest


def _has_kernel_symbol(name: str, kallsyms: str = "/proc/kallsyms") -> bool:
    """The symbol is there *with its address*: without CAP_SYSLOG (the systemd unit's bounding set) kallsyms shows
    every address as 0, libbpf resolves the object's weak ksym to 0, and a hook keyed on it never matches -- then
    the fallback must run, as if the symbol were absent."""
    needle = f" {name}".encode()
    try:
        with open(kallsyms, "rb") as f:
            return any(line.rstrip().endswith(needle) and int(line.split(maxsplit=1)[0], 16) != 0 for line in f)
    except (OSError, ValueError):
        return False


def _mount_tracefs() -> str | None:
    """Mount tracefs if it is not; returns a reason string if tracepoint/* programs cannot work."""
    if (TRACEFS / "events").is_dir():
        return None
    libc = C.CDLL(None, use_errno=True)
    rc = libc.mount(b"nodev", str(TRACEFS).encode(), b"tracefs", 0, None)
    if rc != 0 and not (TRACEFS / "events").is_dir():
        err = C.get_errno()
        return f"tracefs is not mounted at {TRACEFS} and mounting it failed: {os.strerror(err)}"
    return None


def deferrals(loaded: dict[str, int], dio_hook: str, ext4_sync: bool) -> dict[str, dict[str, int]]:
    """The loaded programs that wait for a watch needing them, by trigger (Probe._deferred); ext4_sync: ext4's own
    fsync hooks are there."""
    deferred: dict[str, dict[str, int]] = {}
    # iomap's direct-I/O bios name their file themselves (bi_private): the per-task marks are only needed for the
    # clones device-mapper makes below a stacked filesystem, so their hooks (one run per read/write) wait for one
    marks = DIO_IOMAP if dio_hook == "iomap" else DIO_SYSCALLS
    if _has_kernel_symbol("iomap_dio_bio_end_io"):
        deferred[STACKED] = {n: p for n, p in loaded.items() if n in marks}
    # ext4's own fsync hooks count the fsync-family calls on ext4 (the kind from the system call); the syscall
    # tracepoints, a run per fsync of every task (1.3 us here), are needed only for other filesystems
    if ext4_sync:
        deferred[NOT_EXT4] = {n: p for n, p in loaded.items() if n in FSYNC_SYSCALLS}
    return deferred


def _bcc_attachable(progs: dict[str, int], tracefs_problem: str | None, report: AttachReport) -> dict[str, int]:
    """The bcc build's loaded programs that can attach here: without tracefs no classic tracepoint can (failed), a
    module's absent tracepoint is the module not loaded (disabled, as the object's: _select_programs)."""
    loaded = dict(progs)
    for name in [n for n in loaded if bccload.is_classic(n)]:
        tracepoint, module = bccload.PROGRAMS[name], MODULE_HOOKS.get(name)
        if tracefs_problem or (module and not (TRACEFS / "events" / tracepoint).is_dir()):
            why = tracefs_problem or f"{module} is not loaded: the kernel has no tracepoint {tracepoint}"
            (report.failed if tracefs_problem else report.disabled)[name] = why
            del loaded[name]
    return loaded


class _KernelFeatures:
    """Which tracepoints this kernel has: BTF (vmlinux and loaded modules) for tp_btf, tracefs for tracepoint."""

    def __init__(self, h: C.CDLL, vmlinux: int, btf_path: Path, tracefs_problem: str | None) -> None:
        self._h, self._vmlinux, self._btf_path, self._tracefs_problem = h, vmlinux, btf_path, tracefs_problem
        self._modules: list[int] | None = None

    def has_btf_tracepoint(self, tp: str) -> bool:
        """In vmlinux, or in a loaded module's BTF (ext4 and jbd2 are modules on distribution kernels)."""
        h = self._h
        name, kind = f"btf_trace_{tp}".encode(), libbpf.BTF_KIND_TYPEDEF
        if h.btf__find_by_name_kind(self._vmlinux, name, kind) >= 0:
            return True
        if self._btf_path != VMLINUX_BTF:
            return False
        if self._modules is None:
            self._modules = []
            for f in sorted(self._btf_path.parent.iterdir()):
                if f.name != "vmlinux":
                    b = h.btf__parse_split(str(f).encode(), self._vmlinux)
                    if b:
                        self._modules.append(b)
        return any(h.btf__find_by_name_kind(b, name, kind) >= 0 for b in self._modules)

    def missing(self, name: str, section: str, unavailable: set[str]) -> str | None:
        """Why program `name` (in `section`) cannot run here, or None."""
        if name in unavailable:
            return "marked unavailable"
        kfunc = _KFUNCS.get(name)
        if kfunc and self._h.btf__find_by_name_kind(self._vmlinux, kfunc.encode(), libbpf.BTF_KIND_FUNC) < 0:
            return f"the kernel has no kfunc {kfunc} (Linux < 6.2)"
        kind, tp = _tp_of(section)
        if kind == "tp_btf" and not self.has_btf_tracepoint(tp):
            return f"the kernel has no tracepoint {tp} (nor a loaded module with it)"
        if kind == "tracepoint":
            if self._tracefs_problem:
                return self._tracefs_problem
            if not (TRACEFS / "events" / tp).is_dir():
                hint = " (CONFIG_FTRACE_SYSCALLS?)" if tp.startswith("syscalls/") else ""
                return f"the kernel has no tracepoint {tp}{hint}"
        return None

    def close(self) -> None:
        for b in self._modules or []:
            self._h.btf__free(b)


class Probe:
    """The loaded and attached BPF object. Construct once per daemon; close() (or `with`) detaches everything.

    Parameters
    - max_files: distinct files one tick holds (the hotness table has max_files / 0.76 slots of 48 bytes; a file that
      finds no slot within 1024 probes is counted in Drops.hotness_map_full)
    - ringbuf_bytes: size of the event ring buffer (power of two, >= page size)
    - dio_hook: "auto" (iomap tracepoints if the kernel has them, else syscall tracepoints), "iomap", "syscalls"
    - ignore_self: do not count this process's own file I/O, fsyncs and unlinks (its discards are still seen)
    - unavailable: programs to treat as missing (tests of the partial-attach path)
    - mounts: the mount table to read filesystem types from (default: this host's /proc)
    - bcc_cache: where the bcc path keeps its compiles, one per kernel release and source (probe/bccload.py)
    - bulk_deletes: deletes are aggregated in the kernel (a map) and taken with take_deletes() once a tick, not
      returned by poll() (except those the full map left to the ring: poll() returns them as Delete events)
    """

    def __init__(
        self,
        object_path: str | os.PathLike[str] | None = None,
        *,
        max_files: int = 1 << 18,
        ringbuf_bytes: int = 1 << 22,
        dio_hook: str = "auto",
        ignore_self: bool = True,
        btf_path: str | os.PathLike[str] = VMLINUX_BTF,
        unavailable: Iterable[str] = (),
        mounts: ProcMounts | None = None,
        bcc_cache: str | os.PathLike[str] | None = None,
        bulk_deletes: bool = False,
    ) -> None:
        self.mounts = mounts or ProcMounts()  # which filesystem type a watched device carries
        self._obj: int | None = None
        self._links: list[int] = []
        self._rings: EventRings | None = None  # the discrete events (poll)
        self._hot: KernelHotTable | None = None  # the per-file counters (drain)
        self._watches: WatchTable | None = None  # which devices the kernel watches (watch_volume)
        # loaded programs attached only when a watch needs them: trigger -> {program: handle}
        self._deferred: dict[str, dict[str, int]] = {}
        self._progs: dict[str, int] = {}  # every program of the object, by name
        self._slots: dict[int, int] = {}  # volume dev -> index in the "volumes" array
        self._counters: VolumeCounters | None = None  # per-volume kernel counters (drain_aggregates)
        self.self_tgid = 0  # our tgid as the kernel knows it (0: our own I/O is counted like anyone's)
        if dio_hook not in ("auto", "iomap", "syscalls"):
            raise UserError(f"dio_hook must be auto, iomap or syscalls, not {dio_hook!r}")
        if max_files < 1:
            raise UserError("max_files must be >= 1")
        if ringbuf_bytes < 4096 or ringbuf_bytes & (ringbuf_bytes - 1):
            raise UserError("ringbuf_bytes must be a power of two >= 4096")
        self.max_files = max_files
        # a multiple of 64: each half's claimed bits fill whole words of "hot_claimed"
        self.nslots = max(CP_MIN_SLOTS, -(-math.ceil(max_files / LOAD_FACTOR) // 64) * 64)
        self.ringbuf_bytes = ringbuf_bytes
        self.ignore_self = ignore_self
        self.bulk_deletes = bulk_deletes
        self._deletes: KernelDeletes | None = None  # the deletes map (take_deletes)
        self.object_path = Path(object_path) if object_path else default_object()
        self.report = AttachReport(kernel=os.uname().release)
        self._bcc: BccPrograms | None = None  # the bcc path's maps and programs
        self.bcc_cache = Path(bcc_cache) if bcc_cache else DEFAULT_BCC_CACHE
        try:
            self._open(Path(btf_path), dio_hook, set(unavailable))
        except BaseException:
            self.close()
            raise

    # ---- loading ----
    def _open(self, btf_path: Path, dio_hook: str, unavailable: set[str]) -> None:
        """Feature checks, program selection, load, attach: each step raises UserError naming what is missing."""
        self._h = self._requirements(btf_path)
        if self.capture_path == capture.BCC:
            self._open_bcc(unavailable)
        else:
            reasons = self._open_object(btf_path, unavailable)
            dio_hook = self._select_programs(reasons, dio_hook)
            self._load(dio_hook)
            self._attach(dio_hook)
        self._check_required()
        if self.ignore_self:
            self._claim_self()
        self._rings = EventRings(self._maps, self.ringbuf_bytes, self._config.tick_clock)

    def _requirements(self, btf_path: Path) -> C.CDLL:
        if os.geteuid() != 0:
            raise UserError(f"the eBPF probe needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN); {WORKS_WITHOUT}")
        self._capture = capture.select(btf_path)
        self.capture_path = self._capture.path  # which capture path runs: core or bcc
        if not self.object_path.is_file():
            raise UserError(f"BPF object {self.object_path} not found: set bpf_object in the configuration (or "
                            "--bpf-object), install the package that carries it, or run 'make bpf' in a checkout")
        too_old(os.uname().release, sys.version_info[:2], None)
        try:
            h = libbpf.lib()
        except libbpf.LibbpfMissing as exc:
            raise UserError(f"{exc}; {WORKS_WITHOUT}") from exc
        too_old(os.uname().release, sys.version_info[:2], libbpf.version())
        return h

    def _open_object(self, btf_path: Path, unavailable: set[str]) -> dict[str, str | None]:
        """Open the object and say, per program, why this kernel cannot run it (None: it can)."""
        h = self._h
        vmlinux = h.btf__load_vmlinux_btf() if btf_path == VMLINUX_BTF else h.btf__parse(str(btf_path).encode(), None)
        if not vmlinux:
            err = libbpf.errno_str(C.get_errno())
            raise UserError(f"cannot read the kernel BTF {btf_path}: {err}; {WORKS_WITHOUT}")
        try:
            libbpf.clear_log()
            obj = h.bpf_object__open_file(str(self.object_path).encode(), None)
            if not obj:
                raise UserError(f"cannot open {self.object_path}: {libbpf.errno_str(C.get_errno())}")
            self._obj = obj
            p = h.bpf_object__next_program(obj, None)
            while p:
                self._progs[h.bpf_program__name(p).decode()] = p
                p = h.bpf_object__next_program(obj, p)
            features = _KernelFeatures(h, vmlinux, btf_path, _mount_tracefs())
            try:
                return {name: features.missing(name, self._section(name), unavailable) for name in self._progs}
            finally:
                features.close()
        finally:
            h.btf__free(vmlinux)

    def _section(self, name: str) -> str:
        return str(self._h.bpf_program__section_name(self._progs[name]).decode())

    def _select_programs(self, reasons: dict[str, str | None], dio_hook: str) -> str:
        """Turn off what this kernel lacks and the direct-I/O variant not used; returns the variant used."""
        h = self._h
        if dio_hook == "auto":
            dio_hook = "iomap" if all(reasons.get(n) is None for n in DIO_IOMAP) else "syscalls"
        self.report.dio_hook = dio_hook
        unused_dio = DIO_SYSCALLS if dio_hook == "iomap" else DIO_IOMAP
        off = dict.fromkeys(unused_dio, f"direct I/O attribution uses {dio_hook}")
        # the block I/O variant: with bpf_rdonly_cast where the kernel has it (plain loads instead of probe reads)
        if reasons.get(BIO_FAST) is None:
            off[BIO_COMPAT] = f"block I/O uses {BIO_FAST}"
        elif reasons.get(BIO_COMPAT) is None:
            off[BIO_FAST] = f"block I/O uses {BIO_COMPAT}: {reasons[BIO_FAST]}"
        for name, prog in self._progs.items():
            if name in off:
                self.report.disabled[name] = off[name]
                h.bpf_program__set_autoload(prog, False)
            elif reasons[name]:
                module = MODULE_HOOKS.get(name)
                why = self.report.disabled if module else self.report.failed
                why[name] = f"{module} is not loaded: {reasons[name]}" if module else str(reasons[name])
                h.bpf_program__set_autoload(prog, False)
        return dio_hook

    def _load(self, dio_hook: str) -> None:
        h = self._h
        for name, n in map_sizes(self.nslots, self.ringbuf_bytes).items():
            self._set_max_entries(name, n)
        rc = h.bpf_object__load(self._obj)
        if rc:
            # one line; libbpf's own log (the verifier's output) stays in libbpf.log_tail() for debugging
            raise UserError(
                f"loading {self.object_path.name} failed: {libbpf.errno_str(rc)} (libbpf's log: "
                "cachepilot.probe.libbpf.log_tail())"
            )
        self._bind_maps({name: h.bpf_map__fd(self._map(name)) for name in MAPS}, dio_hook)

    def _open_bcc(self, unavailable: set[str]) -> None:
        """The bcc path: the cached (or a fresh) compile, the same maps, its programs attached as the object's are
        (the same deferrals), tp_btf's as raw tracepoints, the classic ones through perf events."""
        assert self._capture.headers is not None  # capture.select gives bcc headers
        b = self._bcc = bccload.start(self._h, self._capture.headers, self.report.kernel, self.bcc_cache,
                                      self.object_path, MAPS, map_sizes(self.nslots, self.ringbuf_bytes), unavailable)
        self.report.bcc(b)
        self._bind_maps(b.map_fds, bccload.DIO_HOOK)
        loaded = _bcc_attachable(b.progs, _mount_tracefs(), self.report)
        ext4_sync = all(n in loaded and self._attach_one(n, loaded.pop(n)) for n in EXT4_SYNC)
        self._deferred = deferrals(loaded, bccload.DIO_HOOK, ext4_sync)
        self._attach_loaded(loaded)

    def _bind_maps(self, fds: dict[str, int], dio_hook: str) -> None:
        """User space over the loaded maps (either path's): configuration, hotness table, counters, watches."""
        ncpus = self._h.libbpf_num_possible_cpus()
        if ncpus < 1:
            raise UserError(f"cannot count the possible CPUs: {libbpf.errno_str(ncpus)}")
        self._maps = MapAccess(self._h, fds, ncpus)
        flags = (L.CFG_DIO_SYSCALLS if dio_hook == "syscalls" else 0) | (L.CFG_BULK_DELETES if self.bulk_deletes else 0)
        cfg = L.cp_config(flags=flags, nslots=self.nslots)
        self._deletes = KernelDeletes(self._h, fds["deletes"], DELETE_ENTRIES)
        self._config = KernelConfig(self._maps, cfg)
        self._config.tick_clock()
        self._hot = KernelHotTable(self._config, self.nslots)
        self._counters = VolumeCounters(self._maps, self._slots)
        self._watches = WatchTable(self._config, self._counters, self._slots, self.mounts, self._attach_deferred)

    def _attach(self, dio_hook: str) -> None:
        loaded = {n: p for n, p in self._progs.items() if self._h.bpf_program__autoload(p)}
        self._deferred = deferrals(loaded, dio_hook, all(n in loaded for n in EXT4_SYNC))
        self._attach_loaded(loaded)

    def _attach_loaded(self, loaded: dict[str, int]) -> None:
        """Attach every loaded program but those deferred (either path's: libbpf's handles or bcc's descriptors)."""
        if not self._deferred.get(NOT_EXT4):
            self._sync_syscalls_on()
        for name, prog in loaded.items():
            trigger = next((t for t, progs in self._deferred.items() if name in progs), None)
            if trigger is not None:
                self.report.disabled[name] = DEFERRED_UNTIL[trigger]
                continue
            self._attach_one(name, prog)

    def _attach_one(self, name: str, prog: int) -> bool:
        """Attach one program (the object's by libbpf, the bcc build's by its loader); reported either way."""
        if self._bcc is not None:
            why = self._bcc.attach(self._h, name, TRACEFS)
        else:
            link = self._h.bpf_program__attach(prog)
            why = None if link else f"attach failed: {libbpf.errno_str(C.get_errno())}"
            if link:
                self._links.append(link)
        if why:
            self.report.failed[name] = why
            return False
        self.report.disabled.pop(name, None)
        self.report.attached.append(name)
        return True

    def _check_required(self) -> None:
        attached = {hk.feature for hk in HOOKS if hk.program in self.report.attached}
        required = [hk.program for hk in HOOKS if hk.required and hk.feature not in attached]
        if required:
            raise UserError(
                "the probe cannot work: required hook(s) not attached: "
                + "; ".join(f"{p}: {self._why_not(p)}" for p in required)
                + f"; {WORKS_WITHOUT}"
            )

    def _why_not(self, program: str) -> str:
        return self.report.failed.get(program) or self.report.disabled.get(program, "not in object")

    def _claim_self(self) -> None:
        """Tell the kernel which tgid is ours, in its own terms (our getpid() is wrong in a PID namespace)."""
        self.self_tgid, self.report.self_id = self._config.claim_self()

    def _map(self, name: str) -> int:
        m = self._h.bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise UserError(f"map {name} missing from {self.object_path}: rebuild with 'make bpf'")
        return m

    def _set_max_entries(self, name: str, n: int) -> None:
        rc = self._h.bpf_map__set_max_entries(self._map(name), n)
        if rc:
            raise UserError(f"cannot size map {name} to {n}: {libbpf.errno_str(rc)}")

    # ---- which volumes to watch ----
    @property
    def volumes(self) -> dict[int, L.cp_watch]:
        """Every watched device -> its watch entry."""
        return self._watches.volumes if self._watches is not None else {}

    def watch_volume(self, dev: int, *, fs_dev: int | None = None, lower: Iterable[int] = ()) -> None:
        """Watch a cached volume: `dev` the cached block device (kernel dev_t), `fs_dev` the s_dev of the filesystem
        on it (defaults to dev; a device stacked on the volume — LVM, dm-linear, dm-crypt, a direct-I/O loop device —
        when the filesystem is there), `lower` its backing and cache devices (their discards are reported and counted
        for every volume they belong to)."""
        self._watch_table().watch_volume(dev, fs_dev=fs_dev, lower=lower)

    def unwatch(self, dev: int) -> None:
        """Stop watching a volume and the devices watched on its behalf only (a device shared with another watched
        volume stays watched for it); its counters are dropped."""
        self._watch_table().unwatch(dev)

    def _watch_table(self) -> WatchTable:
        if self._watches is None:
            raise UserError("probe is closed")
        return self._watches

    def _sync_syscalls_on(self) -> None:
        """Before the fsync-family syscall hooks attach: ext4's hooks leave the calls those see to them (else one
        call in flight while they attach would count twice)."""
        self._config.cfg.flags |= L.CFG_SYNC_SYSCALLS
        self._config.write()

    def _attach_deferred(self, trigger: str) -> None:
        progs = self._deferred.get(trigger, {})
        if trigger == NOT_EXT4 and progs:
            self._sync_syscalls_on()
        for name, prog in list(progs.items()):
            if self._attach_one(name, prog):
                del progs[name]

    # ---- discrete events ----
    def poll(self, timeout_ms: int = 0) -> list[Event]:
        """Wait up to timeout_ms (-1: until something arrives) for ring-buffer events and return them decoded
        (FreedExtent, Delete, JournalCommit, Discard, then block Barriers), each kind oldest first.

        Bounded work: at most POLL_BUDGET_EVENTS + POLL_BUDGET_BARRIERS records per call (probe/poller.py); what is
        left stays in the rings for the next call. The kernel paces its wakeups (see "Wakeups" in bpf/common.bpf.h): a
        delete, freed extent, commit or discard wakes a waiting poll at once unless one did in the last 20 ms; a record
        that did not wake it is taken by the next look, which poll(-1) makes at least every 100 ms."""
        if self._rings is None:
            raise UserError("probe is closed")
        return self._rings.poll(timeout_ms)

    # ---- per-tick aggregates ----
    def _hot_table(self) -> KernelHotTable:
        if self._hot is None:
            raise UserError("probe is closed")
        return self._hot

    def drain_hotness_raw(self) -> list[tuple[int, ...]]:
        """Drain the hotness table as raw slot tuples
        (ino, dev, gen, read_score, write_score, read_sectors, write_sectors, last_ns, size)."""
        return self._hot_table().drain_raw()

    def drain_hotness_array(self) -> Any:  # numpy.ndarray of cachepilot.models.hotness.HOT_DTYPE (numpy loads lazily)
        """Drain the hotness table as one numpy record array in the models' layout (HOT_DTYPE: dev, ino, gen, rs,
        ws, rb, wb, last, size), ready for HotnessModel.apply_array: the fast path for large drains."""
        return self._hot_table().drain_array()

    def take_deletes(self) -> Any:  # numpy.ndarray of cachepilot.models.hotness.DELETE_DTYPE
        """The deletes the kernel aggregated since the last take (bulk_deletes), oldest first, as one array (dev,
        ino, gen, size, ts_ns); empty without bulk_deletes."""
        if self._deletes is None:
            raise UserError("probe is closed")
        return self._deletes.take()

    def drain(self) -> list[Event]:
        """Per-tick aggregates: one HotnessDelta per file active since the last drain, one MetadataDelta per volume
        with metadata activity, and the cumulative Drops."""
        events: list[Event] = [
            HotnessDelta(FileKey(t[1], t[0], t[2]), t[3], t[4], t[5] << 9, t[6] << 9, t[7], t[8])
            for t in self.drain_hotness_raw()
        ]
        return events + self.drain_aggregates()

    def _volume_counters(self) -> VolumeCounters:
        if self._counters is None:
            raise UserError("probe is closed")
        return self._counters

    def drain_aggregates(self) -> list[Event]:
        """drain() without the hotness table (for a caller that takes it with drain_hotness_array): one
        MetadataDelta per volume with metadata activity, the durability calls counted in the kernel, the Drops."""
        return self._volume_counters().deltas()

    def drops_by_volume(self) -> dict[tuple[int, str], int]:
        """Cumulative drops per (volume dev, kind): an event whose ring was full ("freed_extent", "delete",
        "barrier", "discard", "journal_commit") or a durability call that could not be tracked ("sync_call").
        Only non-zero counters are listed."""
        return self._volume_counters().drops_by_volume()

    def alloc_failures(self, cache_dev: int) -> int:
        """bcache's read-miss inserts refused on a watched cache device since the probe loaded (0 when none, or
        when the bcache hook is not attached: see report)."""
        n = C.c_uint64(0)
        self._maps.lookup("alloc_fails", C.c_uint32(cache_dev), n)
        return n.value

    def volume_state(self, dev: int) -> L.cp_volume | None:
        """The kernel's counters of a watched volume (cumulative totals and the open epoch)."""
        return self._volume_counters().volume_state(dev)

    def drops(self) -> Drops:
        return self._volume_counters().drops()

    def kernel_memory_bytes(self) -> dict[str, int]:
        """Kernel memory charged for each map (memlock from /proc/self/fdinfo)."""
        return self._maps.memory_bytes()

    # ---- lifetime ----
    def close(self) -> None:
        h = getattr(self, "_h", None)
        if h is None:
            return
        if self._rings is not None:
            self._rings.close()
            self._rings = None
        for link in self._links:
            h.bpf_link__destroy(link)
        self._links = []
        if self._hot is not None:
            self._hot.close()
            self._hot = None
        self._deletes = None
        if self._obj:
            h.bpf_object__close(self._obj)
            self._obj = None
        if self._bcc is not None:
            self._bcc.close()
            self._bcc = None

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown
            pass


CP_MIN_SLOTS = 64
