"""The scan detector (engine/promotion.py scan_pollution): a scan is cold files touched far faster than usual, judged
by rate (a long tick is no scan), and only a scan big enough to have displaced the hot set re-warms it at its end
(a burst of a few MiB re-read the whole believed-cached set in the headline fileserver: ~900 promotion reads and
twice the daemon's CPU, for nothing)."""

from __future__ import annotations

from typing import Any

from cachepilot.engine import Engine
from cachepilot.events import FileKey, HotnessDelta, kdev
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy import parse_policy

NS = 1_000_000_000
DEV = kdev(252, 0)
POLICY = """
version: 1
defaults:
  failure_model: recoverable
  promotion: {enabled: true, rate: 1MiB, max_cache_fraction: 0.5, sieve_size: 1MiB}
"""
SIZE = 128 << 10


class Run:
    def __init__(self) -> None:
        self.e = Engine(parse_policy(POLICY, "t.yaml"),
                        [VolumeInfo(dev=DEV, name="v0", kind="dm-cache", cache_bytes=256 << 20)])
        self.rewarms: list[str] = []
        real = self.e.promoter.rewarm

        def spy(c: Any, reason: str, *a: Any, **k: Any) -> int:
            self.rewarms.append(reason)
            return int(real(c, reason, *a, **k))

        self.e.promoter.rewarm = spy  # type: ignore[method-assign]
        self.ino, self.t = 0, 0.0

    def tick(self, files: int, seconds: float = 1.0, fresh: bool = True) -> None:
        """``files`` new (cold) files read over the next ``seconds``, then a tick (``fresh``: its hot_fresh)."""
        for _ in range(files):
            self.ino += 1
            self.e.feed(HotnessDelta(FileKey(DEV, self.ino, 1), 64, 0, SIZE, 0, 1, size=SIZE))
        self.t += seconds
        self.e.tick(int(self.t * NS), hot_fresh=fresh)

    def usual(self, ticks: int = 30) -> None:
        for _ in range(ticks):
            self.tick(10)


def test_a_long_tick_that_covers_more_of_the_usual_touches_is_no_scan() -> None:
    r = Run()
    r.usual()
    r.tick(30, seconds=3.0)  # a stalled guest: three seconds' usual touches in one tick
    r.usual(5)
    assert r.rewarms == [] and not r.e.vols[DEV].scanning


def test_a_burst_too_small_to_displace_the_hot_set_does_not_rewarm_it() -> None:
    r = Run()
    r.usual()
    r.tick(40)  # 4x the usual rate for a tick: 5 MiB cold, 2% of the cache
    r.usual(5)
    assert r.rewarms == []


def test_a_scan_past_a_quarter_of_the_cache_rewarms_at_its_end() -> None:
    r = Run()
    r.usual()
    for _ in range(3):
        r.tick(300)  # 37.5 MiB a tick: 112 MiB cold in all, 44% of the cache
    assert r.rewarms == [] and r.e.vols[DEV].scanning
    r.usual(2)
    assert len(r.rewarms) == 1 and r.rewarms[0].startswith("scan ended") and "MiB cold" in r.rewarms[0]


def test_hotness_taken_every_other_tick_is_judged_over_the_whole_take() -> None:
    """The daemon takes the probe's hotness every other second (intake.HOTNESS_EVERY_NS); the tick between says
    hot_fresh=False and the detector waits for the next take: a rate over half the span would read the usual load as
    a burst and then as nothing, ending a scan after its first take (37 MiB cold: no re-warm)."""
    r = Run()

    def span(files: int) -> None:  # two seconds' touches, taken at the second tick
        r.tick(0, fresh=False)
        r.tick(files)

    for _ in range(15):
        span(20)
    for _ in range(3):
        span(300)  # 37.5 MiB a take, 112 MiB cold in all: 44% of the cache
    assert r.rewarms == [] and r.e.vols[DEV].scanning
    span(20)
    assert len(r.rewarms) == 1 and r.rewarms[0].startswith("scan ended")
