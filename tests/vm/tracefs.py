"""A private ftrace instance (tracefs ``instances/NAME``) for the guest scripts: its own buffer, clock and events, so
one script's trace neither sees nor disturbs another's (the global buffer, another script's instance), and it is
removed when the script is done with it, or fails.

The kernel makes the whole tree of an instance on ``mkdir`` (every event, ``trace``, ``per_cpu/``) and takes it
down on ``rmdir`` (kernel/trace/trace.c ``instance_mkdir`` / ``instance_rmdir``); an event that does not exist has
no ``enable`` to write, so a misspelt one fails at the start, not as an empty trace at the end. Guest scripts: root."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

TRACING = Path("/sys/kernel/tracing")


def make_instance(path: Path) -> None:
    """The kernel builds the instance's tree (a seam: the unit tests' fake tracefs builds its own)."""
    path.mkdir()


def remove_instance(path: Path) -> None:
    """The kernel takes the whole tree down on rmdir, though it is not empty."""
    path.rmdir()


class TraceInstance:
    """``instances/<name>`` with ``events`` ({"system/event": filter, "" for none}) enabled in the order given, on
    ``clock`` ("" leaves the default) with ``buffer_kb`` per CPU (0 leaves the default). A context manager (opened on
    entry, removed on exit, errors included); ``open``/``close`` for a caller whose trace outlives one block."""

    def __init__(self, name: str, events: Mapping[str, str], clock: str = "", buffer_kb: int = 0,
                 root: Path | None = None) -> None:
        self.root = root or TRACING  # read at the call: the unit tests' fake tree stands in for it
        self.dir = self.root / "instances" / name
        self.events, self.clock, self.buffer_kb = dict(events), clock, buffer_kb

    def open(self) -> TraceInstance:
        if not (self.root / "instances").is_dir():  # a bare guest (busybox init) has tracefs unmounted
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(self.root)], check=True)
        make_instance(self.dir)
        try:
            if self.clock:
                (self.dir / "trace_clock").write_text(self.clock)
            if self.buffer_kb:
                (self.dir / "buffer_size_kb").write_text(str(self.buffer_kb))
            for event, flt in self.events.items():
                if flt:
                    (self._event(event) / "filter").write_text(flt + "\n")
                (self._event(event) / "enable").write_text("1")
        except BaseException:
            self.close()  # half set up is no use to anyone: take it down, then say why
            raise
        return self

    def _event(self, event: str) -> Path:
        return self.dir / "events" / event

    def disable(self) -> None:
        """Every event off: the buffer keeps what it holds, nothing more comes in."""
        for event in self.events:
            (self._event(event) / "enable").write_text("0")

    def text(self) -> str:
        return (self.dir / "trace").read_text()

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def clear(self) -> None:
        """The buffer emptied (events stay as they are): a round's share read and gone."""
        (self.dir / "trace").write_text("")

    def overran(self) -> bool:
        """Whether a CPU's buffer lost events (a witness read from it is incomplete)."""
        return any("overrun: 0" not in (cpu / "stats").read_text() for cpu in (self.dir / "per_cpu").iterdir())

    def close(self) -> None:
        """Events off and the instance removed; again, or when it was never made, nothing."""
        if not self.dir.is_dir():
            return
        # an event that never got its enable (a failed open) stops no rmdir: that takes it all down
        with contextlib.suppress(OSError):
            self.disable()
        remove_instance(self.dir)

    def __enter__(self) -> TraceInstance:
        return self.open()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def kdev(device: str) -> int:
    """The kernel's dev_t (MKDEV: major << 20 | minor) of a device node, as a block tracepoint's ``dev`` filter
    compares it."""
    st = os.stat(device)
    return (os.major(st.st_rdev) << 20) | os.minor(st.st_rdev)


class Traced:
    """What reads a ``TraceInstance`` (``self.trace``) and removes it once read: as a context manager, it is removed
    however the block ends (the reading that removes it may never come)."""

    trace: TraceInstance

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.trace.close()
