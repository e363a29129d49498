"""Taking a dm cache target out from under its volume and putting it back (issue 36, ``cachepilot detach`` and
``attach`` on dm-cache and dm-writecache): the live table reloaded onto a ``linear`` target over the origin alone,
the same length, so the device (and the filesystem mounted on it) keeps serving from the origin; the table it
replaced is what ``attach`` loads again. Each load is ``dmsetup reload`` + ``suspend`` + ``resume`` (a suspend that
fails leaves the old table live: ``clear``), read back with ``dmsetup table``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cachepilot.actions import Write
from cachepilot.backends.kinds import Reattach
from cachepilot.errors import KernelRejected

if TYPE_CHECKING:
    from cachepilot.backends.host import Host

log = logging.getLogger("cachepilot.backends")

Dm = Callable[[Sequence[str], float], str]  # the host's dmsetup runner: (argv after dmsetup, timeout) -> stdout
SUSPEND_TIMEOUT_S = 120.0  # dm-writecache's suspend with flush_on_suspend writes every dirty block back first


def linear_line(live: str, origin_at: int) -> str:
    """A ``linear`` table over the origin of ``live`` (a one-target cache table: start, length, target, args;
    the origin is its ``origin_at``-th word), the same length, from the origin's sector 0."""
    f = live.split()
    if len(f) <= origin_at or not f[1].isdigit() or ":" not in f[origin_at]:
        raise KernelRejected(f"cannot find the origin in the table {live!r}")
    return f"0 {f[1]} linear {f[origin_at]} 0"


def load(dm: Dm, name: str, line: str, reason: str, *, lockfs: bool = True) -> Write:
    """Load ``line`` as ``name``'s live table and read it back; the Write's ``before`` is the table it replaced
    (what a later attach loads again). KernelRejected if the table read back is not the one asked for.

    ``lockfs`` False suspends with ``--nolockfs``: the filesystem on the device is not frozen first. For a cache
    that failed: dmsetup's suspend freezes the filesystem by default, and ext4's freeze flushes its journal through
    the failed cache, which fails -- and with it the suspend (seen in the lab: a dm-writecache whose cache device
    returns errors could not be suspended, "dmsetup suspend ... failed", until --nolockfs)."""
    before = dm(("table", name), 10.0).strip()
    dm(("reload", name, "--table", line), 10.0)
    try:
        dm(("suspend", name) if lockfs else ("suspend", "--nolockfs", name), SUSPEND_TIMEOUT_S)
    except Exception:
        dm(("clear", name), 10.0)  # the old table stays live
        raise
    dm(("resume", name), 60.0)
    after = dm(("table", name), 10.0).strip()
    if after.split() != line.split():
        raise KernelRejected(f"{name}: loaded {line!r}, the table reads back {after!r}")
    log.info("%s table: %s -> %s (read back %s): %s", name, before, line, after, reason)
    return Write(f"{name} table", before, line, after)


def saved_table(cache_id: str, writes: tuple[Write, ...]) -> str:  # noqa: ARG001 (the table names the cache)
    """The table the Detach's linear table replaced (its ``before``), which attach loads again."""
    return next((w.before for w in writes if w.target.endswith(" table")), "")


def reattach(target: str) -> Reattach:
    """A dm kind's attach: the saved table (of ``target``) loaded again in place of the linear one."""
    def attach(host: Host, name: str, dm_name: str, line: str) -> Write:  # noqa: ARG001 (the dm name is the key)
        return load(host.dm, dm_name, line, "operator attach (cachepilot attach)")

    return Reattach(f"the {target} table line detach saved", lambda c: c.split()[2:3] == [target], attach,
                    saved_table)
