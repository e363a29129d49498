"""Prometheus metrics for the daemon: a per-tick snapshot, one collector per concern, HTTP and textfile output.

The daemon's side of it::

    box = SnapshotBox()
    registry = make_registry(box)
    server = serve("127.0.0.1:9854", registry)      # optional; never blocks the loop
    ...each tick: box.publish(DaemonSnapshot(...)); write_textfile(path, registry)  # textfile optional
    server.close()

The snapshot side (snapshot.py, listen.py) is what the daemon's status and config need; the registry, the HTTP
server and the textfile writer are imported on first use (PEP 562 ``__getattr__``), so a daemon with
``metrics.listen: ""`` and no textfile loads none of them. The exposition is written by our own encoder
(families.py, exposition.py, process.py: prometheus_client's bytes for the same metrics, tests/unit/test_exposition.py)
and served by our bounded server: the daemon never imports prometheus_client, whose http.server, email, urllib and ssl
were 4 MiB of its RSS with 1 M tracked files (issue 32; tests/unit/test_lazy_imports.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cachepilot.exporter.listen import DEFAULT_LISTEN, parse_listen
from cachepilot.exporter.snapshot import (
    EPOCH_BUCKETS,
    TICK_BUCKETS,
    DaemonSnapshot,
    DetachedVolume,
    Histogram,
    HistogramAccumulator,
    SnapshotBox,
    UnmanagedVolume,
    VolumeSnapshot,
)

if TYPE_CHECKING:  # for the type checkers; at run time they come from __getattr__ below
    from cachepilot.exporter.http import MetricsServer, serve
    from cachepilot.exporter.registry import Registry, SnapshotCollector, make_registry
    from cachepilot.exporter.textfile import write_textfile

_LAZY = {"MetricsServer": "http", "serve": "http", "Registry": "registry", "SnapshotCollector": "registry",
         "make_registry": "registry", "write_textfile": "textfile"}

__all__ = [
    "DEFAULT_LISTEN", "EPOCH_BUCKETS", "TICK_BUCKETS", "DaemonSnapshot", "DetachedVolume", "Histogram",
    "HistogramAccumulator", "MetricsServer", "Registry", "SnapshotBox", "SnapshotCollector", "UnmanagedVolume",
    "VolumeSnapshot",
    "make_registry", "parse_listen", "serve", "write_textfile",
]


def __getattr__(name: str) -> Any:
    """The exporter's output side, imported when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value
