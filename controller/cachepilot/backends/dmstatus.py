"""Parsers for the status lines of the device-mapper cache targets (`dmsetup status NAME`).

The formats are the kernel's (Documentation/admin-guide/device-mapper/{cache,writecache}.rst). A line may be
given whole (``"0 2097152 cache 8 14/4096 ..."``) or as the target's own fields only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class StatusParseError(ValueError):
    """A status line that does not have the documented shape; the message names the field."""


def _target_fields(line: str, target: str) -> list[str]:
    fields = line.split()
    # "<start> <length> <target> ..." as printed by dmsetup; strip it when present.
    if len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit() and fields[2] == target:
        fields = fields[3:]
    elif fields and fields[0] == target:
        fields = fields[1:]
    return fields


def _int(fields: list[str], i: int, name: str) -> int:
    try:
        value = int(fields[i])
    except IndexError:
        raise StatusParseError(f"status line ends before field {i + 1} ({name})") from None
    except ValueError:
        raise StatusParseError(f"field {i + 1} ({name}) is {fields[i]!r}, not a number") from None
    if value < 0:
        raise StatusParseError(f"field {i + 1} ({name}) is negative: {value}")
    return value


def _ratio(fields: list[str], i: int, name: str) -> tuple[int, int]:
    try:
        used, total = fields[i].split("/")
        return int(used), int(total)
    except IndexError:
        raise StatusParseError(f"status line ends before field {i + 1} ({name})") from None
    except ValueError:
        raise StatusParseError(f"field {i + 1} ({name}) is {fields[i]!r}, not USED/TOTAL") from None


def _counted(fields: list[str], i: int, name: str) -> tuple[list[str], int]:
    """A '<#n> <arg>*' group: returns the args and the index after them."""
    n = _int(fields, i, f"#{name}")
    args = fields[i + 1 : i + 1 + n]
    if len(args) != n:
        raise StatusParseError(f"{name}: {n} announced, {len(args)} present")
    return args, i + 1 + n


@dataclass(frozen=True)
class DmCacheStatus:
    failed: bool = False
    metadata_block_sectors: int = 0
    metadata_used_blocks: int = 0
    metadata_total_blocks: int = 0
    cache_block_sectors: int = 0
    cache_used_blocks: int = 0
    cache_total_blocks: int = 0
    read_hits: int = 0
    read_misses: int = 0
    write_hits: int = 0
    write_misses: int = 0
    demotions: int = 0
    promotions: int = 0
    dirty_blocks: int = 0
    features: tuple[str, ...] = ()
    core_args: dict[str, str] = field(default_factory=dict)
    policy: str = ""
    policy_args: tuple[str, ...] = ()
    metadata_mode: str = ""  # rw | ro
    needs_check: bool = False

    @property
    def io_mode(self) -> str:
        """writeback | writethrough | passthrough (the kernel's default is writethrough when none is listed)."""
        for mode in ("writeback", "writethrough", "passthrough"):
            if mode in self.features:
                return mode
        return "writethrough"

    @property
    def dirty_bytes(self) -> int:
        return self.dirty_blocks * self.cache_block_sectors * 512

    @property
    def cache_bytes(self) -> int:
        return self.cache_total_blocks * self.cache_block_sectors * 512


def parse_dm_cache_status(line: str) -> DmCacheStatus:
    fields = _target_fields(line, "cache")
    # "Fail": the target is in fail mode; "Error": it could not read its own metadata to report (6.1 prints this
    # when its cache device returns errors: seen in the lab, metadata commit failed, then fail mode). Neither has
    # the figures: a failed cache either way.
    if fields in (["Fail"], ["Error"]):
        return DmCacheStatus(failed=True)
    md_used, md_total = _ratio(fields, 1, "used/total metadata blocks")
    c_used, c_total = _ratio(fields, 3, "used/total cache blocks")
    features, i = _counted(fields, 11, "features")
    core, i = _counted(fields, i, "core args")
    if len(core) % 2:
        raise StatusParseError(f"core args are not key/value pairs: {core}")
    if i >= len(fields):
        raise StatusParseError("status line ends before the policy name")
    policy = fields[i]
    policy_args, i = _counted(fields, i + 1, "policy args")
    if i >= len(fields):
        raise StatusParseError("status line ends before the metadata mode")
    return DmCacheStatus(
        metadata_block_sectors=_int(fields, 0, "metadata block size"),
        metadata_used_blocks=md_used,
        metadata_total_blocks=md_total,
        cache_block_sectors=_int(fields, 2, "cache block size"),
        cache_used_blocks=c_used,
        cache_total_blocks=c_total,
        read_hits=_int(fields, 4, "read hits"),
        read_misses=_int(fields, 5, "read misses"),
        write_hits=_int(fields, 6, "write hits"),
        write_misses=_int(fields, 7, "write misses"),
        demotions=_int(fields, 8, "demotions"),
        promotions=_int(fields, 9, "promotions"),
        dirty_blocks=_int(fields, 10, "dirty"),
        features=tuple(features),
        core_args=dict(zip(core[::2], core[1::2], strict=True)),
        policy=policy,
        policy_args=tuple(policy_args),
        metadata_mode=fields[i],
        needs_check=len(fields) > i + 1 and fields[i + 1] == "needs_check",
    )


@dataclass(frozen=True)
class DmWritecacheStatus:
    error: int
    total_blocks: int
    free_blocks: int
    writeback_blocks: int
    # Kernels from 5.15 on append ten statistics counters (read blocks, read hits, write blocks, ...).
    stats: tuple[int, ...] = ()

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks


def parse_dm_writecache_status(line: str) -> DmWritecacheStatus:
    fields = _target_fields(line, "writecache")
    names = ("error", "total blocks", "free blocks", "blocks under writeback")
    values = [_int(fields, i, n) for i, n in enumerate(names)]
    stats = tuple(_int(fields, i, f"statistic {i - 3}") for i in range(4, len(fields)))
    if values[2] > values[1]:
        raise StatusParseError(f"free blocks ({values[2]}) exceed total blocks ({values[1]})")
    return DmWritecacheStatus(values[0], values[1], values[2], values[3], stats=stats)
