"""dm-cache: one instance per dm ``cache`` target, through ``dmsetup`` (table, status, message, reload).

What the kernel does (drivers/md/dm-cache-target.c, 6.1): the table line is the constructor's arguments
(``<meta> <cache> <origin> <block> <#features> <features> <policy> <#args> <args>``); the io mode and the policy
change only by a table reload (``dmsetup reload`` + ``suspend`` + ``resume``). A failed reload leaves the old
table live: it is checked with ``dmsetup table``. A reload to writethrough leaves dirty blocks dirty, so
dirty blocks are drained in writethrough with the ``cleaner`` policy (it writes back every dirty block and
promotes nothing) and the previous mode and policy are put back once ``dirty`` reads 0. passthrough is loaded
only from a clean cache, after a writethrough drain. ``migration_threshold`` changes live by message; reloads
carry its live value along.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cachepilot.actions import Detach, Drain, SetWritePolicy
from cachepilot.backends import uncache
from cachepilot.backends.base import Write
from cachepilot.backends.dmstatus import DmCacheStatus, StatusParseError, parse_dm_cache_status
from cachepilot.backends.host import BlockDev, Host
from cachepilot.backends.kernelio import COMMIT
from cachepilot.backends.kinds import Described, Kind, KnobDef
from cachepilot.backends.operation import Operation, OperationBackend, Setting
from cachepilot.capabilities import BYPASS, KIND_DMCACHE, WRITEBACK
from cachepilot.errors import KernelRejected, UserError
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.models.writeback import WritebackView

NAME = KIND_DMCACHE
_IO_MODES = ("writeback", "writethrough", "passthrough")
# smq cleans nothing while the origin is busy (dm-cache-policy-smq.c clean_target_met: "If we're busy we don't worry
# about cleaning at all"); the cleaner policy writes back regardless
SMQ_BUSY = ("dm-cache's smq cleans only once the origin has been idle for a second (clean_target_met: busy, no"
            " cleaning): a drain (cachepilot drain, the cleaner policy) writes back under load")


@dataclass(frozen=True)
class CacheTable:
    """A dm-cache table line, split into what a reload may change (mode, policy, policy args) and the rest."""

    head: tuple[str, ...]  # start, length, "cache", meta, cache, origin, block size
    features: tuple[str, ...]
    policy: str
    policy_args: tuple[str, ...]

    @classmethod
    def parse(cls, line: str) -> CacheTable:
        f = line.split()
        try:
            if f[2] != "cache":
                raise KernelRejected(f"not a dm-cache table: {line!r}")
            n = int(f[7])
            features = tuple(f[8:8 + n])
            policy = f[8 + n]
            m = int(f[9 + n])
            args = tuple(f[10 + n:10 + n + m])
        except (IndexError, ValueError):
            raise KernelRejected(f"dm-cache table line not understood: {line!r}") from None
        if len(args) != m:
            raise KernelRejected(f"dm-cache table line ends early: {line!r}")
        return cls(tuple(f[:7]), features, policy, args)

    @property
    def mode(self) -> str:
        return next((x for x in self.features if x in _IO_MODES), "writethrough")

    def with_(self, *, mode: str | None = None, policy: str | None = None,
              policy_args: tuple[str, ...] | None = None) -> CacheTable:
        features = self.features
        if mode is not None:
            features = tuple(x for x in features if x not in _IO_MODES) + (mode,)
        return CacheTable(self.head, features, policy or self.policy,
                          self.policy_args if policy_args is None else policy_args)

    def line(self) -> str:
        return " ".join((*self.head, str(len(self.features)), *self.features, self.policy,
                         str(len(self.policy_args)), *self.policy_args))

    def same_config(self, other: CacheTable) -> bool:
        return (self.mode, self.policy, sorted(self.features)) == (other.mode, other.policy, sorted(other.features))


def _with_arg(args: tuple[str, ...], key: str, value: str) -> tuple[str, ...]:
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    pairs[key] = value
    return tuple(x for kv in pairs.items() for x in kv)


class DmCacheBackend(OperationBackend):
    kind = NAME
    busy_hold: ClassVar[str] = SMQ_BUSY  # why write-back waits under writes, in the kind's words (lvmcache: LVM's)

    @property
    def dm_name(self) -> str:
        return self.host.dm_name_of(self.info.name)

    def sample(self, now_ns: int) -> VolumeSample:
        return sample(self.host, self.info, now_ns, commit=self.commit_due(now_ns), busy=self.busy_hold)

    def status(self) -> DmCacheStatus:
        line = self.dmsetup(("status", self.dm_name))
        try:
            s = parse_dm_cache_status(line)
        except StatusParseError as exc:
            raise KernelRejected(f"dmsetup status {self.dm_name}: {exc}") from None
        if s.failed:
            # not DeviceGone: the device is still there, serving (or failing) I/O, and stays managed -- latched,
            # alerted on, and detachable with accept_loss (cachepilot detach --accept-loss)
            raise KernelRejected(f"{self.dm_name}: dm-cache reports Fail (its cache device failed)")
        return s

    def table(self) -> CacheTable:
        return CacheTable.parse(self.dmsetup(("table", self.dm_name)))

    # -------------------------------------------------------------- settings
    def table_setting(self, what: str) -> Setting:
        """The table as one setting: value = 'mode/policy'. A reload with the live migration_threshold."""
        name = self.dm_name

        def get() -> str:
            t = self.table()
            return f"{t.mode}/{t.policy}"

        def put(value: str) -> None:
            mode, policy = value.split("/")
            old = self.table()
            args = old.policy_args if policy == old.policy else tuple(
                x for kv in zip(old.policy_args[::2], old.policy_args[1::2], strict=False)
                if kv[0] == "migration_threshold" for x in kv)  # core args only; a policy's own are its own
            live = self.status().core_args.get("migration_threshold")
            if live is not None:
                args = _with_arg(args, "migration_threshold", live)
            new = old.with_(mode=mode, policy=policy, policy_args=args)
            self.reload(new, old)

        return Setting(f"{name} table ({what})", get, put)

    def reload(self, new: CacheTable, old: CacheTable) -> None:
        """reload + suspend + resume. If the reload is refused the old table is still live (checked)."""
        name = self.dm_name
        try:
            self.dmsetup(("reload", name, "--table", new.line()))
        except KernelRejected:
            live = self.table()
            if not live.same_config(old):
                raise KernelRejected(f"{name}: reload refused and the live table changed: {live.line()}") from None
            raise
        try:
            self.dmsetup(("suspend", name), 60.0)
        except Exception:
            self.dmsetup(("clear", name))  # drop the inactive table; the old one stays live
            raise
        self.dmsetup(("resume", name), 60.0)

    def migration_threshold_setting(self) -> Setting:
        name = self.dm_name
        return Setting(f"{name} migration_threshold",
                       lambda: self.status().core_args.get("migration_threshold", ""),
                       lambda v: self._message("migration_threshold", v))

    def _message(self, *words: str) -> None:
        self.dmsetup(("message", self.dm_name, "0", *words))

    # -------------------------------------------------------------- operations
    def _start(self, op: Operation) -> bool:
        a = op.action
        if isinstance(a, Detach):
            return self._detach(op, a)
        t = self.table()
        # A cleaner left live (a daemon that died mid-drain) is not a policy to go back to.
        op.data["policy"] = t.policy if t.policy != "cleaner" else "smq"
        op.data["mode"] = t.mode
        if isinstance(a, Drain):
            return self._begin_drain(op, t.mode, a.reason)
        assert isinstance(a, SetWritePolicy)
        if a.mode not in self.caps.modes:
            raise KernelRejected(f"dm-cache has no write mode {a.mode!r}")
        if a.mode == WRITEBACK:
            op.put(self.table_setting("mode"), f"writeback/{op.data['policy']}", a.reason)
            return True
        # writethrough or passthrough: first writethrough (no new dirty blocks), drained with the cleaner.
        op.data["mode"] = "writethrough"
        if self._begin_drain(op, "writethrough", a.reason):
            return self._finish_switch(op)
        return False

    def _detach(self, op: Operation, a: Detach) -> bool:
        """A linear table over the origin loaded in place of the cache, only from a clean cache (a reload does not
        write dirty blocks back: the operator's drain with the cleaner policy did), or with accept_loss on a cache
        that failed (its dirty blocks are lost: the operator accepted it)."""
        name = self.dm_name
        failed = a.accept_loss and parse_dm_cache_status(self.dmsetup(("status", name))).failed
        dirty = "the failed cache's" if failed else self.status().dirty_blocks
        live = self.table().line()
        line = uncache.linear_line(live, 5)
        if dirty and not a.accept_loss:
            raise KernelRejected(f"{name}: {dirty} dirty blocks: drain first (a reload onto the origin"
                                 " would lose them)")
        if op.dry_run:
            op.writes.append(Write(f"{name} table", live, line, "(dry run)"))
            return True
        # a failed cache: no filesystem freeze before the suspend (its journal flush would fail on the cache)
        op.writes.append(uncache.load(self.host.dm, name, line, a.reason, lockfs=not failed))
        op.phase = f"linear over the origin ({dirty} dirty blocks left behind)"
        return True

    def _begin_drain(self, op: Operation, mode: str, reason: str) -> bool:
        """Load ``mode`` (True: already clean), or while dirty blocks remain writethrough with the cleaner policy:
        under load dm-cache writes back only blocks that have not been written for 10-20 s
        (``Capabilities.drain_needs_idle``), so a block made dirty during a drain in writeback could outlast it.
        The end of the cleaner loads the saved mode with the saved policy again."""
        if self.status().dirty_blocks == 0:
            if self.table().mode == mode:
                op.phase = "clean"
                return True
            op.put(self.table_setting("mode"), f"{mode}/{op.data['policy']}", reason)
            # Blocks written in write-back between that read and the reload are dirty in the new mode too (the lab,
            # W3: 12 blocks of ext4's atime/journal writes): they are drained like any others.
            if op.dry_run or self.status().dirty_blocks == 0:
                op.phase = "clean"
                return True
        op.phase = "cleaning"
        op.put(self.table_setting("cleaner"), "writethrough/cleaner", f"drain: {reason}")
        op.data["cleaner"] = "1"
        return False

    def _advance(self, op: Operation, now_ns: int) -> bool:
        if self.status().dirty_blocks:
            return False
        self._end_cleaner(op, f"drained: {op.action.reason}")
        op.phase = "clean"
        if isinstance(op.action, SetWritePolicy):
            return self._finish_switch(op)
        return True

    def _end_cleaner(self, op: Operation, reason: str) -> None:
        if op.data.pop("cleaner", None):
            op.put(self.table_setting("policy"), f"{op.data['mode']}/{op.data['policy']}", reason)

    def _undo(self, op: Operation) -> None:
        self._end_cleaner(op, f"undo {op.action.kind}")

    def _finish_switch(self, op: Operation) -> bool:
        a = op.action
        assert isinstance(a, SetWritePolicy)
        want = self.caps.kernel_mode_names[a.mode]
        if a.mode == BYPASS:
            op.put(self.table_setting("mode"), f"passthrough/{op.data['policy']}", a.reason)
        if not op.dry_run:
            s, t = self.status(), self.table()
            if s.dirty_blocks or t.mode != want:
                raise KernelRejected(f"{self.dm_name}: {t.mode} with {s.dirty_blocks} dirty blocks after "
                                     f"switching to {want}")
        op.phase = f"{want}, clean"
        return True



# ------------------------------------------------------------------ the kind: discovery, description, samples
def detect(dev: BlockDev) -> bool:
    return dev.dm_target == "cache"


def cache_device(table: tuple[str, ...] | list[str]) -> str:
    """The cache device of a table line as dmsetup prints it (major:minor): the cache's identity."""
    # "<start> <len> cache <metadata dev> <cache dev> <origin dev> ..."
    return table[4] if len(table) > 4 else ""


# dm-cache keeps one discard bit per discard block and at most this many of them (drivers/md/dm-cache-target.c:
# calculate_discard_block_size doubles the cache block size until the origin has no more than MAX_DISCARD_BLOCKS)
_MAX_DISCARD_BLOCKS = 1 << 14


def discard_block_bytes(table: tuple[str, ...] | list[str]) -> int:
    """dm-cache's discard block of a table line (bytes): the cache block size, doubled until the origin (the
    table's length) holds at most 2**14 of them. Only a discard covering whole discard blocks sets a bit, and only
    a set bit spares a dirty block its write-back (kernel-facts: mg_full_copy). 512 when the line is not a
    cache table."""
    # "<start> <len> cache <metadata dev> <cache dev> <origin dev> <block size> ..."
    if len(table) < 7 or not table[1].isdigit() or not table[6].isdigit() or int(table[6]) == 0:
        return 512
    origin, block = int(table[1]), int(table[6])
    while origin // block > _MAX_DISCARD_BLOCKS:
        block *= 2
    return block * 512


def describe(host: Host, dev: BlockDev) -> Described:
    return Described(parse_dm_cache_status(host.dm(("status", dev.dm_name), 10.0)).cache_bytes,
                     cache_device(dev.dm_table), discard_block_bytes(dev.dm_table))


def sample(host: Host, info: VolumeInfo, now: int, *, commit: bool = False, busy: str = SMQ_BUSY) -> VolumeSample:
    """One reading; ``commit``: with the metadata committed first, which is when a dead cache device shows
    (Capabilities.failure_seen_at_commit); ``busy``: the kind's words for smq's hold under writes (SMQ_BUSY)."""
    dm_name = host.dm_name_of(info.name)
    line = host.dm(("status", dm_name, COMMIT) if commit else ("status", dm_name), 10.0)
    cache_id = cache_device(host.dm(("table", dm_name), 10.0).split())
    try:
        s = parse_dm_cache_status(line)
    except StatusParseError as exc:
        raise UserError(f"dmsetup status {dm_name}: {exc}") from None
    return VolumeSample(
        dev=info.dev, ts_ns=now, mode=s.io_mode if not s.failed else "writethrough",
        dirty_bytes=s.dirty_bytes, hits=s.read_hits + s.write_hits,
        misses=s.read_misses + s.write_misses, io_errors=0,
        failed=s.failed or s.metadata_mode == "ro" or s.needs_check,
        knobs={k: v for k, v in s.core_args.items()}, cache_id=cache_id, writeback=writeback_view(s, busy),
    )


def writeback_view(s: DmCacheStatus, busy_hold: str = SMQ_BUSY) -> WritebackView:
    """What the stall watch needs (models/writeback.py). dm-cache holds no dirty data on purpose (smq cleans
    everything once the origin idles), so any dirty data that does not fall is watched; its write hits are writes
    to blocks already cached, its mapped blocks what an unclean shutdown marks dirty."""
    note = ""
    if s.metadata_mode == "ro" or s.needs_check:
        note = "its metadata is read-only (needs_check): dm-cache writes nothing back until it is repaired"
    elif s.core_args.get("migration_threshold") == "0":
        note = "migration_threshold is 0: dm-cache may move no block between cache and origin"
    busy = "" if s.policy == "cleaner" else busy_hold
    return WritebackView(writes=s.write_hits + s.write_misses, overwrites=s.write_hits,
                         mapped_bytes=s.cache_used_blocks * s.cache_block_sectors * 512, policy=s.policy, note=note,
                         busy_hold=busy)


# Modes, drain and the knob's range: cachepilot.capabilities. Mode and policy: table reloads; migration_threshold:
# by message (dm-cache-target.c, cache_message).
KIND = Kind(NAME, DmCacheBackend, detect, describe, sample,
            knobs=(KnobDef("migration_threshold", DmCacheBackend.migration_threshold_setting),),
            reattach=uncache.reattach("cache"))
