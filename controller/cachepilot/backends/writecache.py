"""dm-writecache: one instance per dm ``writecache`` target, through ``dmsetup``.

What the kernel does (drivers/md/dm-writecache.c, 6.1): the target is write-back only (reads of blocks not in
the cache go to the origin; nothing is promoted on read), so the only mode is writeback. Messages are ``flush``
(commit, write every block back, and return when done — the drain), ``flush_on_suspend`` and ``cleaner``
(irreversible until the next reload). Watermarks, ``writeback_jobs`` and ``autocommit_*`` are optional table
arguments: they change by a table reload (``reload`` + ``suspend`` + ``resume``) and read back from
``dmsetup table``, which prints the ones that were set.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachepilot.actions import Drain, SetKnob, SetWritePolicy
from cachepilot.backends.base import Write
from cachepilot.backends.dmstatus import DmWritecacheStatus, StatusParseError, parse_dm_writecache_status
from cachepilot.backends.inspect import sample_volume
from cachepilot.backends.kernelio import read_attr
from cachepilot.backends.operation import Operation, OperationBackend, Setting
from cachepilot.capabilities import KIND_WRITECACHE, WRITEBACK
from cachepilot.errors import KernelRejected
from cachepilot.models.volume import VolumeSample

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
        opts = [(k, v) for k, v in self.options if k != key] + [(key, value)]
        return WritecacheTable(self.head, tuple(opts))

    def line(self) -> str:
        words = [w for k, v in self.options for w in ((k,) if v is None else (k, v))]
        return " ".join((*self.head, str(len(words)), *words))


class WritecacheBackend(OperationBackend):
    kind = KIND_WRITECACHE
    flush_timeout_s = 300.0

    @property
    def dm_name(self) -> str:
        return read_attr(self.sysfs_root / "block" / self.info.name / "dm" / "name")

    def sample(self, now_ns: int) -> VolumeSample:
        return sample_volume(self.info, sysfs_root=self.sysfs_root, dm=self.dmsetup, now_ns=now_ns)

    def status(self) -> DmWritecacheStatus:
        try:
            return parse_dm_writecache_status(self.dmsetup(("status", self.dm_name)))
        except StatusParseError as exc:
            raise KernelRejected(f"dmsetup status {self.dm_name}: {exc}") from None

    def table(self) -> WritecacheTable:
        return WritecacheTable.parse(self.dmsetup(("table", self.dm_name)))

    def option_setting(self, key: str) -> Setting:
        name = self.dm_name

        def put(value: str) -> None:
            old = self.table()
            self.dmsetup(("reload", name, "--table", old.with_(key, value).line()))
            try:
                self.dmsetup(("suspend", name), 60.0)
            except Exception:
                self.dmsetup(("clear", name))  # the old table stays live
                raise
            self.dmsetup(("resume", name), 60.0)

        return Setting(f"{name} {key}", lambda: self.table().get(key) or "", put)

    def _start(self, op: Operation) -> bool:
        a = op.action
        if isinstance(a, SetKnob):
            knob = self.caps.knobs().get(a.knob)
            if knob is None:
                raise KernelRejected(f"dm-writecache has no knob {a.knob!r}")
            op.put(self.option_setting(knob.name), str(knob.parse(a.value)), a.reason)
            return True
        if isinstance(a, SetWritePolicy):
            if a.mode != WRITEBACK:
                raise KernelRejected(f"dm-writecache is write-back only; it cannot be set to {a.mode}")
            op.phase = "writeback (the only mode)"
            return True
        assert isinstance(a, Drain)
        return self._flush(op, a.reason)

    def _flush(self, op: Operation, reason: str) -> bool:
        """The flush message returns once every block is written back; used blocks must then read 0."""
        name = self.dm_name
        before = self.status().used_blocks
        target = f"{name} message 0 flush"
        if op.dry_run:
            op.writes.append(Write(target, f"{before} used blocks", "flush", "(dry run)"))
            return True
        self.dmsetup(("message", name, "0", "flush"), self.flush_timeout_s)
        after = self.status()
        op.writes.append(Write(target, f"{before} used blocks", "flush", f"{after.used_blocks} used blocks"))
        if after.error:
            raise KernelRejected(f"{name}: the cache reports error {after.error} after flush")
        op.phase = f"flushed {before} blocks: {reason}"
        # Writes that arrived during the flush may already be cached again: that is new data, not a failure,
        # but the drain is complete only when the status read after the flush showed nothing left.
        return after.used_blocks == 0

    def _advance(self, op: Operation, now_ns: int) -> bool:
        assert isinstance(op.action, Drain)
        return self._flush(op, op.action.reason)

