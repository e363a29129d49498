"""The probe: the kernel half loaded (probe/loader.py: checks, capture path, selection, load, attach) and its
runtime: which devices the kernel watches, and the kernel's maps and ring buffers turned into typed events
(cachepilot.events).

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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cachepilot import bpf_layout as L
from cachepilot.errors import UserError
from cachepilot.events import (
    Drops,
    Event,
    FileKey,
    HotnessDelta,
)
from cachepilot.mountinfo import ProcMounts
from cachepilot.probe import libbpf
from cachepilot.probe.bccload import DEFAULT_CACHE as DEFAULT_BCC_CACHE
from cachepilot.probe.checks import VMLINUX_BTF, default_object
from cachepilot.probe.counters import VolumeCounters
from cachepilot.probe.deletes import KernelDeletes
from cachepilot.probe.hooks import LOAD_FACTOR, map_sizes
from cachepilot.probe.hottable import KernelHotTable
from cachepilot.probe.kconfig import KernelConfig
from cachepilot.probe.loader import AttachReport, Loader
from cachepilot.probe.maps import MapAccess
from cachepilot.probe.poller import EventRings
from cachepilot.probe.watches import WatchTable

CP_MIN_SLOTS = 64


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
    - wake_every_ns: the event ring wakes a waiting poll at most this often (besides its quarter crossings); None:
      the kernel's CP_WAKE_EVERY_NS, 20 ms (bpf/common.bpf.h, "Wakeups")
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
        wake_every_ns: int | None = None,
    ) -> None:
        self.mounts = mounts or ProcMounts()  # which filesystem type a watched device carries
        self._loader: Loader | None = None  # the load and the attachments (probe/loader.py)
        self._rings: EventRings | None = None  # the discrete events (poll)
        self._hot: KernelHotTable | None = None  # the per-file counters (drain)
        self._watches: WatchTable | None = None  # which devices the kernel watches (watch_volume)
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
        if wake_every_ns is not None and not 0 < wake_every_ns < 1 << 63:
            raise UserError(f"wake_every_ns must be > 0, not {wake_every_ns}")
        self.wake_every_ns = wake_every_ns or 0  # 0: the kernel's default
        self._deletes: KernelDeletes | None = None  # the deletes map (take_deletes)
        self.object_path = Path(object_path) if object_path else default_object()
        self.report = AttachReport(kernel=os.uname().release)
        self.bcc_cache = Path(bcc_cache) if bcc_cache else DEFAULT_BCC_CACHE
        try:
            self._open(Path(btf_path), dio_hook, set(unavailable))
        except BaseException:
            self.close()
            raise

    def _open(self, btf_path: Path, dio_hook: str, unavailable: set[str]) -> None:
        """Load (each step raises UserError naming what is missing), bind the maps, attach, claim our own tgid."""
        loader = self._loader = Loader(self.object_path, self.report, nslots=self.nslots,
                                       ringbuf_bytes=self.ringbuf_bytes, bcc_cache=self.bcc_cache)
        fds = loader.load(btf_path, dio_hook, unavailable)
        self._h = loader.h
        self.capture_path = loader.capture_path  # which capture path runs: core or bcc
        self._bind_maps(fds, self.report.dio_hook)
        loader.attach(self._sync_syscalls_on)
        loader.check_required()
        if self.ignore_self:
            self._claim_self()
        self._rings = EventRings(self._maps, self.ringbuf_bytes, self._config.tick_clock)

    def _bind_maps(self, fds: dict[str, int], dio_hook: str) -> None:
        """User space over the loaded maps (either path's): configuration, hotness table, counters, watches."""
        ncpus = self._h.libbpf_num_possible_cpus()
        if ncpus < 1:
            raise UserError(f"cannot count the possible CPUs: {libbpf.errno_str(ncpus)}")
        self._maps = MapAccess(self._h, fds, ncpus)
        flags = (L.CFG_DIO_SYSCALLS if dio_hook == "syscalls" else 0) | (L.CFG_BULK_DELETES if self.bulk_deletes else 0)
        cfg = L.cp_config(flags=flags, nslots=self.nslots, wake_every_ns=self.wake_every_ns)
        deletes = map_sizes(self.nslots, self.ringbuf_bytes)["deletes"]  # as the loader sized the map
        self._deletes = KernelDeletes(self._h, fds["deletes"], deletes)
        self._config = KernelConfig(self._maps, cfg)
        self._config.tick_clock()
        self._hot = KernelHotTable(self._config, self.nslots)
        self._counters = VolumeCounters(self._maps, self._slots)
        assert self._loader is not None  # _open made it
        self._watches = WatchTable(self._config, self._counters, self._slots, self.mounts,
                                   self._loader.attach_deferred)

    def _claim_self(self) -> None:
        """Tell the kernel which tgid is ours, in its own terms (our getpid() is wrong in a PID namespace)."""
        self.self_tgid, self.report.self_id = self._config.claim_self()

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

    def unread(self) -> bool:
        """Whether either ring holds records not yet taken, whether or not they woke anyone (a record within the
        wake period of the last wakeup does not): a consumer that looks on its own schedule reads them then instead
        of waiting for the next wakeup."""
        if self._rings is None:
            raise UserError("probe is closed")
        return self._rings.unread()

    def wake_on(self, fd: int) -> None:
        """A poll also returns as soon as ``fd`` is readable (the daemon's stop request: its loop then waits on the
        rings until the next tick, not in short slices to look at the stop flag)."""
        if self._rings is None:
            raise UserError("probe is closed")
        self._rings.wake_on(fd)

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
        loader = getattr(self, "_loader", None)
        if loader is None:
            return
        if self._rings is not None:
            self._rings.close()
            self._rings = None
        loader.detach()
        if self._hot is not None:
            self._hot.close()
            self._hot = None
        self._deletes = None
        loader.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown
            pass

