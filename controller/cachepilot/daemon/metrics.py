"""The daemon's side of the Prometheus exporter (cachepilot.exporter, optional in a build): a snapshot box the loop
publishes to every tick (the exporter's DaemonSnapshot, built from the one status snapshot when a scrape asks), HTTP on
``metrics.listen`` and/or the node_exporter textfile. A taken port is logged; the daemon runs on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cachepilot.daemon.config import DaemonConfig
from cachepilot.daemon.status import Status, exporter_snapshot
from cachepilot.errors import UserError

log = logging.getLogger("cachepilot")
NS = 1_000_000_000


class Metrics:
    def __init__(self, exporter: Any, textfile: Any) -> None:
        self.ex = exporter
        self.textfile = textfile
        self.box = exporter.SnapshotBox()
        self.registry = exporter.make_registry(self.box)
        self.ticks = exporter.HistogramAccumulator(exporter.TICK_BUCKETS)
        self.server: Any = None

    @classmethod
    def attach(cls, cfg: DaemonConfig) -> Metrics | None:
        """The exporter as configured, or None (not configured, or not in this build)."""
        if not (cfg.metrics_listen or cfg.metrics_textfile):
            return None
        try:
            from cachepilot import exporter
        except ImportError:
            log.info("metrics: no exporter in this build; %s not served", cfg.metrics_listen)
            return None
        m = cls(exporter, cfg.metrics_textfile)
        if cfg.metrics_listen:
            try:
                m.server = exporter.serve(cfg.metrics_listen, m.registry, m.box)
                log.info("metrics: http://%s/metrics", cfg.metrics_listen)
            except UserError as exc:
                log.warning("metrics: not served: %s", exc)
        return m

    def publish(self, snap: Status, tick_ns: int, now_wall: float, once: Callable[[str], None]) -> None:
        """The exporter's snapshot of ``snap``: built now for the textfile (written every tick), else built by the
        first scrape that wants it (``snap`` and the frozen tick histogram do not change afterwards)."""
        if tick_ns:
            self.ticks.observe(tick_ns / NS)
        ticks = self.ticks.freeze()

        def build() -> Any:
            left_out: list[str] = []
            built = exporter_snapshot(snap, ticks, now_wall, left_out)
            for msg in left_out:
                once(msg)
            return built

        if not self.textfile:
            self.box.publish_lazy(build)
            return
        self.box.publish(build())
        try:
            self.ex.write_textfile(self.textfile, self.registry)
        except OSError as exc:
            once(f"metrics: textfile {self.textfile} not written: {exc.strerror}")
        except UserError as exc:  # a directory another user could redirect the file in: refused, said once
            once(f"metrics: textfile not written: {exc}")

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
