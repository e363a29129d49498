"""node_exporter's textfile collector: write the exposition to ``DIR/cachepilot.prom`` atomically.

node_exporter reads every ``*.prom`` file of its ``--collector.textfile.directory`` on each scrape; a file it
catches half-written is an error for that scrape. So the text goes to a hidden temporary file in the same
directory (not matching ``*.prom``), is fsynced, and replaces the old file with one rename. The temporary is made
and its mode set through safeio's one output path (``O_EXCL|O_NOFOLLOW`` in the directory checked by descriptor,
``fchmod``): a user who can write in the directory and swaps the temporary for a link gets nothing chmodded (it
was ``chmod`` by path: root made any file 0644, a 0600 secret or a raw disk).
"""

from __future__ import annotations

import os

from cachepilot.exporter.exposition import text
from cachepilot.exporter.registry import Registry
from cachepilot.safeio import write_atomic


def write_textfile(path: str | os.PathLike[str], registry: Registry) -> None:
    """Write the registry's exposition (text format 0.0.4, which node_exporter reads) to ``path`` (which should end
    in ``.prom``), 0644 (node_exporter usually runs as its own user). OSError on failure, UnsafeOutput if another
    user could redirect it; the previous file is then left as it was."""
    write_atomic(os.fspath(path), text(registry.collect()), "metrics textfile", 0o644)
