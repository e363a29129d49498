"""Prometheus metrics for the daemon: a per-tick snapshot, one collector per concern, HTTP and textfile output.

The daemon's side of it::

    box = SnapshotBox()
    registry = make_registry(box)
    server = serve("127.0.0.1:9854", registry)      # optional; never blocks the loop
    ...each tick: box.publish(DaemonSnapshot(...)); write_textfile(path, registry)  # textfile optional
    server.close()
"""

from cachepilot.exporter.http import DEFAULT_LISTEN, MetricsServer, parse_listen, serve
from cachepilot.exporter.registry import SnapshotCollector, make_registry
from cachepilot.exporter.snapshot import (
    EPOCH_BUCKETS,
    TICK_BUCKETS,
    DaemonSnapshot,
    Histogram,
    HistogramAccumulator,
    SnapshotBox,
    UnmanagedVolume,
    VolumeSnapshot,
)
from cachepilot.exporter.textfile import write_textfile

__all__ = [
    "DEFAULT_LISTEN", "EPOCH_BUCKETS", "TICK_BUCKETS", "DaemonSnapshot", "Histogram", "HistogramAccumulator",
    "MetricsServer", "SnapshotBox", "SnapshotCollector", "UnmanagedVolume", "VolumeSnapshot", "make_registry",
    "parse_listen", "serve", "write_textfile",
]
