"""node_exporter's textfile collector: write the exposition to ``DIR/cachepilot.prom`` atomically.

node_exporter reads every ``*.prom`` file of its ``--collector.textfile.directory`` on each scrape; a file it
catches half-written is an error for that scrape. So the text goes to a hidden temporary file in the same
directory (not matching ``*.prom``), is fsynced, and replaces the old file with one rename.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry


def write_textfile(path: str | os.PathLike[str], registry: CollectorRegistry) -> None:
    """Write the registry's exposition to ``path`` (which should end in ``.prom``). OSError on failure; the
    previous file is then left as it was."""
    target = Path(path)
    data = generate_latest(registry)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # node_exporter usually runs as its own user
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
