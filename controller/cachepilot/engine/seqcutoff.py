"""Steering bcache's ``sequential_cutoff`` by what a volume's sequential runs are made of.

bcache bypasses a bio that continues a sequential run once the run (or the task's running average of its runs)
reaches ``sequential_cutoff`` (``check_should_bypass`` in request.c: the last 128 I/Os hashed by end sector, a
bio starting where one of them ended within 5 s extends its run; default 4 MiB). The cutoff is meant for streams
— a backup, a video, one big file that would flush the cache — but a writer creating many small files into
contiguous free space builds the same runs, and those small files (the data most likely to be read again, or to
die dirty in the cache) go around it. The cache's counters do not say which; the probe does: per tick, the bytes
each file wrote and its size.

Per window (policy ``sequential_steering.window``), for one volume: ``small`` = bytes written by files smaller
than the cutoff (and how many), ``stream`` = bytes written by files at least as large, ``bypassed`` = what the
cache's ``stats_total/bypassed`` rose by. Then one step at most:

- **raise** (x2, up to ``max_cutoff``) when the cache bypassed at least a cutoff's worth, the small-file writes
  were at least a cutoff's worth from at least ``MIN_FILES`` files, and outweigh the stream writes ``DOMINANCE``
  to one: the runs it bypassed can only have been made of small files;
- **lower** (/2, never below the value found at start) when stream writes outweigh small-file writes: the cutoff
  should again send streams around the cache.

Every write goes through the backend's knob path (read back, logged with this reason); the value found at start is
put back when the daemon stops (:meth:`SequentialSteering.restore`), when steering is turned off or the knob is
pinned by the policy. Reads are not counted: a backup reading small files in order also forms runs, and caching
those is what the cutoff is for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cachepilot.capabilities import KNOBS
from cachepilot.errors import UserError
from cachepilot.policy.model import SequentialSteering as Settings

KNOB = "sequential_cutoff"
MIN_FILES = 8
DOMINANCE = 4
NS = 1_000_000_000


@dataclass
class _Volume:
    base: int | None = None  # the cutoff found before any write of ours (bytes)
    cutoff: int | None = None  # as last sampled
    bypassed: int | None = None  # stats_total/bypassed as last sampled
    window_start_ns: int | None = None
    bypassed_at_start: int | None = None
    small: int = 0
    small_files: int = 0
    stream: int = 0
    moved: bool = False  # we have written the knob (so it is ours to put back)


def _parse(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(KNOBS[KNOB].parse(value))
    except (UserError, ValueError):
        return None


class SequentialSteering:
    """The rule for every bcache volume of the engine (keyed by the volume's dev)."""

    def __init__(self) -> None:
        self.vols: dict[int, _Volume] = {}

    def track(self, dev: int) -> None:
        self.vols.setdefault(dev, _Volume())

    def forget(self, dev: int) -> None:
        self.vols.pop(dev, None)

    def sampled(self, dev: int, knobs: dict[str, str], bypassed: int | None) -> None:
        v = self.vols.get(dev)
        if v is None:
            return
        v.cutoff = _parse(knobs.get(KNOB))
        if v.base is None:
            v.base = v.cutoff
        v.bypassed = bypassed

    def written(self, rec: np.ndarray) -> None:
        """A drain's hotness records (HOT_DTYPE): the written bytes of each file and its size."""
        if not len(rec) or not self.vols:
            return
        wb = rec["wb"]
        for dev, v in self.vols.items():
            if not v.cutoff:
                continue
            mask = (rec["dev"] == dev) & (wb > 0)
            if not mask.any():
                continue
            small = mask & (rec["size"] < v.cutoff)
            v.small += int(wb[small].sum())
            v.small_files += int(small.sum())
            v.stream += int(wb[mask & ~small].sum())

    def decide(self, dev: int, policy: Settings, pinned: bool, now: int) -> tuple[str, str] | None:
        """(value, reason) to write now, or None."""
        v = self.vols.get(dev)
        if v is None or v.cutoff is None or v.base is None:
            return None
        if pinned:  # the policy's value wins and stays (it is no longer ours to put back)
            v.moved = False
            return None
        if not policy.enabled:
            return self._put_back(v, "steering is off")
        if v.window_start_ns is None or v.bypassed_at_start is None:
            self._new_window(v, now)
            return None
        if now - v.window_start_ns < policy.window_s * NS:
            return None
        got = self._step(v, policy)
        self._new_window(v, now)
        return got

    def _step(self, v: _Volume, policy: Settings) -> tuple[str, str] | None:
        assert v.cutoff is not None and v.base is not None
        bypassed = max(0, (v.bypassed or 0) - (v.bypassed_at_start or 0))
        seen = (f"last window: {v.small >> 10} KiB written by {v.small_files} file(s) smaller than the cutoff, "
                f"{v.stream >> 10} KiB by larger ones, {bypassed >> 10} KiB bypassed")
        if (bypassed >= v.cutoff and v.small >= v.cutoff and v.small_files >= MIN_FILES
                and v.small >= DOMINANCE * v.stream and v.cutoff < policy.max_cutoff):
            v.moved = True
            return str(min(policy.max_cutoff, 2 * v.cutoff)), (
                f"sequential runs are small-file creates, not streams ({seen}): raising {KNOB}")
        if v.stream > v.small and v.cutoff > v.base:
            return str(max(v.base, v.cutoff // 2)), (
                f"sequential runs are streams again ({seen}): lowering {KNOB} towards {v.base}")
        return None

    @staticmethod
    def _new_window(v: _Volume, now: int) -> None:
        v.window_start_ns, v.bypassed_at_start = now, v.bypassed
        v.small = v.small_files = v.stream = 0

    @staticmethod
    def _put_back(v: _Volume, why: str) -> tuple[str, str] | None:
        if not v.moved or v.base is None or v.cutoff == v.base:
            return None
        return str(v.base), f"{why}: putting back the {KNOB} found at start"

    def steered(self, dev: int) -> tuple[str, str] | None:
        """(the value found at start, the value last sampled) while the cutoff is ours to put back, else None."""
        v = self.vols.get(dev)
        if v is None or not v.moved or v.base is None or v.cutoff is None or v.cutoff == v.base:
            return None
        return str(v.base), str(v.cutoff)

    def restore(self, dev: int) -> tuple[str, str] | None:
        """The value found at start, if we changed it (the daemon stops)."""
        v = self.vols.get(dev)
        return None if v is None else self._put_back(v, "stopping")
