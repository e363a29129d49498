"""The exporter's registry: runs every concern's collector over the last published snapshot, timing each.

Like node_exporter, a failing collector does not fail the scrape: its metrics are left out and
``cachepilot_exporter_collector_success{kind="<collector>"}`` says 0 (the error is logged once per kind of error).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from prometheus_client import ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from cachepilot.exporter.collectors import COLLECTORS, Collect
from cachepilot.exporter.snapshot import SnapshotBox

log = logging.getLogger("cachepilot.exporter")


class SnapshotCollector(Collector):
    def __init__(self, box: SnapshotBox, collectors: dict[str, Collect] | None = None) -> None:
        self.box = box
        self.collectors = dict(COLLECTORS if collectors is None else collectors)
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
            start = time.perf_counter()
            try:
                metrics = collect(snapshot)
                ok = 1
            except Exception as e:  # noqa: BLE001 — one broken collector must not take the others down
                metrics, ok = [], 0
                key = (name, type(e).__name__)
                if key not in self._logged:
                    self._logged.add(key)
                    log.error("metrics collector %s failed: %s: %s", name, type(e).__name__, e)
            duration.add_metric([name], time.perf_counter() - start)
            success.add_metric([name], ok)
            yield from metrics
        yield success
        yield duration


def make_registry(box: SnapshotBox) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(box))
    # The daemon's own process (RSS against the unit's MemoryMax, CPU, open files), as cachepilot_process_*: the
    # prefix keeps them apart from node_exporter's own process_* when the textfile collector carries them.
    ProcessCollector(namespace="cachepilot", registry=registry)
    return registry
