"""dm-writecache: one instance per dm ``writecache`` target, through ``dmsetup``.

What the kernel does (drivers/md/dm-writecache.c, 6.1): the target is write-back only (reads of blocks not in
the cache go to the origin; nothing is promoted on read), so the only mode is writeback. Messages are ``flush``
(commit, write every block back, and return when done — the drain), ``flush_on_suspend`` and ``cleaner``
(irreversible until the next reload). The flush message blocks its caller until every block is written back --
minutes for a full cache on a slow origin -- so it runs on a thread of its own while the daemon's loop goes on
ticking (the systemd watchdog, status, the drain's progress from ``dmsetup status``). ``max_age``, watermarks,
``writeback_jobs`` and ``autocommit_*`` are optional table arguments: they change by a table reload (``reload`` +
``suspend`` + ``resume``; the cache's committed entries survive it, ``writecache_resume``), several of them in one
(``Kind.group``), and read back from ``dmsetup table``, which prints the ones that were set.
Under the destructive model the engine delegates the exposure bound to ``max_age`` and the watermarks
(engine.nativebound).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from cachepilot.actions import Detach, Drain, SetWritePolicy
from cachepilot.backends import uncache
from cachepilot.backends.base import Write
from cachepilot.backends.dmstatus import DmWritecacheStatus, StatusParseError, parse_dm_writecache_status
from cachepilot.backends.host import BlockDev, Host
from cachepilot.backends.kinds import Described, Kind, KnobDef
from cachepilot.backends.operation import Operation, OperationBackend, Setting, grouped
from cachepilot.capabilities import KIND_WRITECACHE, WRITEBACK, capabilities
from cachepilot.errors import CachepilotError, KernelRejected, UserError
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.models.writeback import WritebackView

NAME = KIND_WRITECACHE

# Optional arguments that take a value (the rest are flags).
_VALUED = frozenset({"high_watermark", "low_watermark", "writeback_jobs", "autocommit_blocks", "autocommit_time",
                     "start_sector", "max_age", "pause_writeback"})


@dataclass(frozen=True)
class WritecacheTable:
    head: tuple[str, ...]  # start, length, "writecache", p|s, origin, cache, block size
    options: tuple[tuple[str, str | None], ...]

    @classmethod
    def parse(cls, line: str) -> WritecacheTable:
        f = line.split()
        try:
            if f[2] != "writecache":
                raise KernelRejected(f"not a dm-writecache table: {line!r}")
            n = int(f[7])
        except (IndexError, ValueError):
            raise KernelRejected(f"dm-writecache table line not understood: {line!r}") from None
        words, i = f[8:8 + n], 0
        opts: list[tuple[str, str | None]] = []
        if len(words) != n:
            raise KernelRejected(f"dm-writecache table line ends early: {line!r}")
        while i < len(words):
            if words[i] in _VALUED and i + 1 < len(words):
                opts.append((words[i], words[i + 1]))
                i += 2
            else:
                opts.append((words[i], None))
                i += 1
        return cls(tuple(f[:7]), tuple(opts))

    def get(self, key: str) -> str | None:
        return next((v for k, v in self.options if k == key), None)

    def with_(self, key: str, value: str) -> WritecacheTable:
        """The table with ``key`` set to ``value``; "" takes the argument out (the kernel's default again: what a
        knob found unset is put back to)."""
        opts = [(k, v) for k, v in self.options if k != key] + ([(key, value)] if value else [])
        return WritecacheTable(self.head, tuple(opts))

    def line(self) -> str:
        words = [w for k, v in self.options for w in ((k,) if v is None else (k, v))]
        return " ".join((*self.head, str(len(words)), *words))


@dataclass
class _Flush:
    """One ``flush`` message in flight on its own thread; ``error`` is what it raised, once ``done``."""

    before: int  # used blocks when it was sent
    done: threading.Event = field(default_factory=threading.Event)
    error: CachepilotError | None = None

    def start(self, send: Callable[[], object], name: str) -> _Flush:
        def run() -> None:
            try:
                send()
            except CachepilotError as exc:
                self.error = exc
            finally:
                self.done.set()

        threading.Thread(target=run, name=f"cachepilot-flush-{name}", daemon=True).start()
        return self


class WritecacheBackend(OperationBackend):
    kind = NAME
    flush_timeout_s = 300.0
    _flush_in_flight: _Flush | None = None  # the kernel finishes a flush once sent: a later drain waits on it

    @property
    def dm_name(self) -> str:
        return self.host.dm_name_of(self.info.name)

    def sample(self, now_ns: int) -> VolumeSample:
        return sample(self.host, self.info, now_ns)

    def status(self) -> DmWritecacheStatus:
        try:
            return parse_dm_writecache_status(self.dmsetup(("status", self.dm_name)))
        except StatusParseError as exc:
            raise KernelRejected(f"dmsetup status {self.dm_name}: {exc}") from None

    def table(self) -> WritecacheTable:
        return WritecacheTable.parse(self.dmsetup(("table", self.dm_name)))

    def option_setting(self, key: str) -> Setting:
        return Setting(f"{self.dm_name} {key}", lambda: self.table().get(key) or "",
                       lambda value: self._reload({key: value}))

    def options_setting(self, keys: tuple[str, ...]) -> Setting:
        """Several optional arguments changed by one reload (a reload per argument suspended the device each time:
        four for the delegated bound, 8.5-11.5 s a tick in the TCG lab); read back from the table, each compared."""
        def get() -> dict[str, str]:
            t = self.table()
            return {k: t.get(k) or "" for k in keys}

        return grouped(f"{self.dm_name} {','.join(keys)}", get, self._reload)

    def _reload(self, values: dict[str, str]) -> None:
        """The live table with ``values`` set ("" takes an argument out), loaded in one reload, suspend and resume;
        the kernel checks the table as a whole (a high watermark below the low one is refused, whatever the order)."""
        new = self.table()
        for key, value in values.items():
            new = new.with_(key, value)
        self._load(new)

    def _load(self, new: WritecacheTable) -> None:
        """``new`` loaded: reload, suspend, resume (the old table stays live if the suspend fails)."""
        name = self.dm_name
        self.dmsetup(("reload", name, "--table", new.line()))
        try:
            self.dmsetup(("suspend", name), 60.0)
        except Exception:
            self.dmsetup(("clear", name))  # the old table stays live
            raise
        self.dmsetup(("resume", name), 60.0)

    def _start(self, op: Operation) -> bool:
        a = op.action
        if isinstance(a, SetWritePolicy):
            if a.mode != WRITEBACK:
                raise KernelRejected(f"dm-writecache is write-back only; it cannot be set to {a.mode}")
            op.phase = "writeback (the only mode)"
            return True
        if isinstance(a, Detach):
            return self._detach(op, a)
        assert isinstance(a, Drain)
        return self._flush(op, a.reason)

    def _flush(self, op: Operation, reason: str) -> bool:
        """Send the flush message on its own thread (or join the one still in flight); done when it returns."""
        name = self.dm_name
        before = self.status().used_blocks
        target = f"{name} message 0 flush"
        if op.dry_run:
            op.writes.append(Write(target, f"{before} used blocks", "flush", "(dry run)"))
            return True
        if self._flush_in_flight is None or self._flush_in_flight.done.is_set():
            self._flush_in_flight = _Flush(before).start(
                lambda: self.dmsetup(("message", name, "0", "flush"), self.flush_timeout_s), name)
        op.phase = f"flushing: {before} used blocks when sent: {reason}"
        return False

    def _detach(self, op: Operation, a: Detach) -> bool:
        """The documented removal (Documentation/admin-guide/device-mapper/writecache.rst): the ``flush_on_suspend``
        message, then a linear table over the origin loaded, whose suspend writes every block still dirty back
        (writecache_suspend under writeback_all) before the linear table goes live. A cache that reports an error
        is refused unless the operator accepted the loss (then no flush is asked: it would fail)."""
        name, st = self.dm_name, self.status()
        line = uncache.linear_line(self.table().line(), 4)
        if st.error and not a.accept_loss:
            raise KernelRejected(f"{name}: the cache reports error {st.error} with {st.used_blocks} used blocks:"
                                 " refused without accept_loss")
        if op.dry_run:
            op.writes.append(Write(f"{name} table", self.table().line(), line, "(dry run)"))
            return True
        if not st.error:
            self.dmsetup(("message", name, "0", "flush_on_suspend"))
            op.writes.append(Write(f"{name} message 0 flush_on_suspend", f"{st.used_blocks} used blocks",
                                   "flush_on_suspend", "(a message: nothing to read back)"))
        # a failed cache: no filesystem freeze before the suspend (its journal flush would fail on the cache)
        op.writes.append(uncache.load(self.host.dm, name, line, a.reason, lockfs=not st.error))
        op.phase = (f"linear over the origin ({st.used_blocks} used blocks lost with the failed cache)" if st.error
                    else f"linear over the origin ({st.used_blocks} used blocks written back by the suspend)")
        return True

    def _advance(self, op: Operation, now_ns: int) -> bool:
        """Progress (used blocks left) while the flush runs; the outcome once it returned."""
        assert isinstance(op.action, Drain)
        fl = self._flush_in_flight
        if fl is None:  # no flush of this drain's in flight (a restart between): send one
            return self._flush(op, op.action.reason)
        name = self.dm_name
        now = self.status()
        if not fl.done.is_set():
            op.phase = f"flushing: {now.used_blocks} of {fl.before} used blocks left: {op.action.reason}"
            return False
        self._flush_in_flight = None
        if fl.error is not None:
            raise fl.error
        op.writes.append(Write(f"{name} message 0 flush", f"{fl.before} used blocks", "flush",
                               f"{now.used_blocks} used blocks"))
        if now.error:
            raise KernelRejected(f"{name}: the cache reports error {now.error} after flush")
        op.phase = f"flushed {fl.before} blocks ({now.used_blocks} written since): {op.action.reason}"
        # The message returns once every block dirty when it was sent is written back (process_flush_mesg waits
        # for writecache_writeback under writeback_all): the drain is complete. Blocks written meanwhile are new
        # data (Capabilities.drain_done_as_of_start); flushing again until a steady load pauses would never end.
        return True


# ------------------------------------------------------------------ the kind: discovery, description, samples
def detect(dev: BlockDev) -> bool:
    return dev.dm_target == "writecache"


def cache_device(table: tuple[str, ...] | list[str]) -> str:
    """The cache device of a table line as dmsetup prints it (major:minor): the cache's identity."""
    # "<start> <len> writecache <p|s> <origin dev> <cache dev> <block size> ..."
    return table[5] if len(table) > 5 else ""


def describe(host: Host, dev: BlockDev) -> Described:
    t = dev.dm_table
    block = int(t[6]) if len(t) > 6 and t[6].isdigit() else 4096
    total = parse_dm_writecache_status(host.dm(("status", dev.dm_name), 10.0)).total_blocks
    return Described(total * block, cache_device(t), block)  # writecache_discard frees whole blocks only


def sample(host: Host, info: VolumeInfo, now: int) -> VolumeSample:
    dm_name = host.dm_name_of(info.name)
    line = host.dm(("status", dm_name), 10.0)
    table = host.dm(("table", dm_name), 10.0)
    cache_id = cache_device(table.split())
    try:
        w = parse_dm_writecache_status(line)
    except StatusParseError as exc:
        raise UserError(f"dmsetup status {dm_name}: {exc}") from None
    block = info.cache_bytes // w.total_blocks if w.total_blocks else 4096
    written = w.stats[2] * block if len(w.stats) >= 3 else None  # blocks written to the target (5.15+)
    hits = w.stats[1] + w.stats[3] + w.stats[4] if len(w.stats) >= 5 else 0  # read hits + write hits
    total = w.stats[0] + w.stats[2] if len(w.stats) >= 3 else 0  # read blocks + write blocks
    knobs = _knobs(table)
    return VolumeSample(
        dev=info.dev, ts_ns=now, mode="writeback", dirty_bytes=w.used_blocks * block, hits=hits,
        misses=max(0, total - hits), io_errors=w.error, failed=w.error != 0, cache_id=cache_id,
        knobs=knobs, written_bytes=written, writeback=writeback_view(w, knobs, info.cache_bytes, table),
    )


def writeback_view(w: DmWritecacheStatus, knobs: dict[str, str], cache_bytes: int, table: str) -> WritebackView:
    """What the stall watch needs (models/writeback.py): dm-writecache writes back only above high_watermark
    (until low_watermark) or entries older than max_age (when set), and with ``cleaner`` everything; below the
    watermark without max_age dirty data sits by design. max_age is re-checked every max_age/16
    (writecache_max_age_timer): twice max_age may pass with nothing written back."""
    cleaner = " cleaner" in f" {table} "
    max_age_ms = int(knobs["max_age"]) if knobs.get("max_age", "").isdigit() else 0
    try:
        high = int(knobs.get("high_watermark", "50"))
    except ValueError:
        high = 50
    hold = 0 if cleaner or max_age_ms else cache_bytes * high // 100
    writes = w.stats[2] if len(w.stats) >= 3 else None
    over = w.stats[3] + w.stats[4] if len(w.stats) >= 5 else None  # write hits, uncommitted and committed
    return WritebackView(hold_bytes=hold, quiet_s=2 * max_age_ms / 1000, writes=writes, overwrites=over,
                         policy="cleaner" if cleaner else "", busy_hold=_pause_hold(knobs, table, cleaner))


def _pause_hold(knobs: dict[str, str], table: str, cleaner: bool) -> str:
    """Why write-back waits while writes come: ``writecache_writeback`` first waits until the origin has had no
    write for ``pause_writeback`` ms -- PAUSE_WRITEBACK (3000) when the table does not set it, SSD mode only (a
    pmem cache, 'p', has none; 0 turns it off), not under ``cleaner`` or a flush. Writes reach the origin when no
    block is free, and every flush (fsync) sends one there (``writecache_map_flush``): so the stock table holds
    write-back under a syncing load. "" when there is no such pause."""
    words = table.split()
    if cleaner or len(words) < 4 or words[3] != "s":
        return ""
    set_ms = knobs.get("pause_writeback", "")
    pause = int(set_ms) if set_ms.isdigit() else _PAUSE_WRITEBACK_MS
    if pause <= 0:
        return ""
    how = f"pause_writeback ({pause} ms)" if set_ms else f"pause_writeback ({pause} ms, the kernel's default)"
    return (f"dm-writecache holds write-back until no write has gone to the origin for {how}; every flush (fsync)"
            " and every write it has no free block for goes there")


_PAUSE_WRITEBACK_MS = 3000  # PAUSE_WRITEBACK in dm-writecache.c (HZ * 3), SSD mode, when the table sets none


# What writecache_ctr uses for a watermark the table does not set (HIGH_WATERMARK, LOW_WATERMARK in dm-writecache.c);
# max_age (unset: no age bound) and pause_writeback (unset: PAUSE_WRITEBACK, 3 s in SSD mode) are reported only
# when set.
_DEFAULTS = {"high_watermark": "50", "low_watermark": "45"}
_WHEN_SET = ("max_age", "pause_writeback")


def _knobs(table: str) -> dict[str, str]:
    """The watermarks (the kernel's defaults where unset), max_age and pause_writeback (ms) when the table sets them."""
    try:
        t = WritecacheTable.parse(table)
    except KernelRejected:
        return dict(_DEFAULTS)
    out = {k: t.get(k) or d for k, d in _DEFAULTS.items()}
    out.update((k, v) for k in _WHEN_SET if (v := t.get(k)))
    return out


def _option(name: str) -> KnobDef:
    """An optional table argument (changed by a reload)."""
    return KnobDef(name, lambda b: b.option_setting(name))


# Modes, drain and knobs with their ranges: cachepilot.capabilities; every knob is an optional table argument.
KIND = Kind(NAME, WritecacheBackend, detect, describe, sample,
            knobs=tuple(_option(n) for n in capabilities(NAME).knobs()),
            group=lambda b, keys: b.options_setting(keys), reattach=uncache.reattach("writecache"))
