"""What the engine decides. Every action carries a human-readable reason; backends carry them out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Promote:
    """Read these byte ranges of a file through the cached volume so the cache admits them."""

    volume: str
    dev: int
    ino: int
    gen: int
    ranges: tuple[tuple[int, int], ...]  # (offset, length) in bytes
    reason: str

    @property
    def kind(self) -> str:
        return "promote"

    def line(self) -> str:
        size = sum(n for _, n in self.ranges)
        return f"promote {self.volume} ino={self.ino} gen={self.gen} bytes={size}: {self.reason}"


@dataclass(frozen=True, slots=True)
class DiscardRanges:
    """FITRIM these byte ranges of the filesystem on the volume (only still-free blocks get discarded)."""

    volume: str
    fs_dev: int
    ranges: tuple[tuple[int, int], ...]  # (offset, length) in bytes
    reason: str

    @property
    def kind(self) -> str:
        return "discard"

    def line(self) -> str:
        size = sum(n for _, n in self.ranges)
        return f"discard {self.volume} ranges={len(self.ranges)} bytes={size}: {self.reason}"


@dataclass(frozen=True, slots=True)
class SetWritePolicy:
    volume: str
    mode: str  # writeback | writethrough | bypass (bcache "none", dm-cache "passthrough")
    reason: str

    @property
    def kind(self) -> str:
        return "set_write_policy"

    def line(self) -> str:
        return f"set_write_policy {self.volume} {self.mode}: {self.reason}"


@dataclass(frozen=True, slots=True)
class SetKnob:
    volume: str
    knob: str
    value: str
    reason: str

    @property
    def kind(self) -> str:
        return "set_knob"

    def line(self) -> str:
        return f"set_knob {self.volume} {self.knob}={self.value}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Drain:
    """Drive the volume's dirty data to zero by ``deadline_ns`` (CLOCK_MONOTONIC), then restore the previous
    settings: bcache ``writeback_percent`` 0 until ``dirty_data`` is 0, dm-cache the ``cleaner`` policy until dirty
    is 0, dm-writecache the ``flush`` message. The write-back flush point of Qin et al., made periodic: it is what
    makes the destructive model's age bound hold by construction. A drain that misses its deadline is a breach."""

    volume: str
    deadline_ns: int
    reason: str

    @property
    def kind(self) -> str:
        return "drain"

    def line(self) -> str:
        return f"drain {self.volume} deadline={self.deadline_ns}: {self.reason}"


Action = Promote | DiscardRanges | SetWritePolicy | SetKnob | Drain
