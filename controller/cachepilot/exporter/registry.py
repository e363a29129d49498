"""The exporter's registry: runs every concern's collector over the last published snapshot, timing each, then the
daemon's own process metrics.

Like node_exporter, a failing collector does not fail the scrape: its metrics are left out and
``cachepilot_exporter_collector_success{kind="<collector>"}`` says 0 (the error is logged once per kind of error).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from cachepilot.exporter.collectors import COLLECTORS, Collect
from cachepilot.exporter.families import GaugeMetricFamily, Metric
from cachepilot.exporter.process import ProcessMetrics
from cachepilot.exporter.snapshot import SnapshotBox

log = logging.getLogger("cachepilot.exporter")


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class Registry:
    """The collectors a scrape runs, in the order they were registered (the exposition's order)."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def collect(self) -> Iterator[Metric]:
        for collector in self._collectors:
            yield from collector.collect()


class SnapshotCollector:
    def __init__(self, box: SnapshotBox, collectors: dict[str, Collect] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.box = box
        self.collectors = dict(COLLECTORS if collectors is None else collectors)
        self.clock = clock  # times each collector (a test's own clock makes the durations known)
        self._logged: set[tuple[str, str]] = set()

    def collect(self) -> Iterator[Metric]:
        snapshot = self.box.latest()
        if snapshot is None:  # the daemon has not finished its first tick: it is up, not ready
            yield GaugeMetricFamily("cachepilot_ready", "1 once the probe is attached and the volumes adopted.", 0)
            return
        success = GaugeMetricFamily("cachepilot_exporter_collector_success",
                                    "1 if the collector built its metrics.", labels=["kind"])
        duration = GaugeMetricFamily("cachepilot_exporter_collector_duration_seconds",
                                     "How long the collector took.", labels=["kind"])
        for name, collect in self.collectors.items():
            start = self.clock()
            try:
                metrics = collect(snapshot)
                ok = 1
            except Exception as e:  # noqa: BLE001 — one broken collector must not take the others down
                metrics, ok = [], 0
                key = (name, type(e).__name__)
                if key not in self._logged:
                    self._logged.add(key)
                    log.error("metrics collector %s failed: %s: %s", name, type(e).__name__, e)
            duration.add_metric([name], self.clock() - start)
            success.add_metric([name], ok)
            yield from metrics
        yield success
        yield duration


def make_registry(box: SnapshotBox, proc: str = "/proc", clock: Callable[[], float] = time.perf_counter) -> Registry:
    registry = Registry()
    registry.register(SnapshotCollector(box, clock=clock))
    registry.register(ProcessMetrics("cachepilot", proc))
    return registry
