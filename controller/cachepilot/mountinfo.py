"""The one reader of the mount table (``/proc/self/mountinfo``, proc(5)), rooted at a proc directory so that tests
read fixture files. Below everything that needs it: the probe (which filesystem type a device carries), discovery
(where a volume's filesystem is mounted) and describe (``backends.host.Host`` owns one)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cachepilot.events import kdev_major_minor


@dataclass(frozen=True, slots=True)
class Mount:
    """One line: the device, the root of the mount within its filesystem, where it is mounted, its mount and
    superblock options together, and the filesystem type."""

    dev: str  # "major:minor"
    root: str
    mountpoint: str
    options: frozenset[str]
    fstype: str


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Every well-formed line (optional fields end at the `` - `` separator; octal escapes undone)."""
    out: list[Mount] = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 6 or not rest:
            continue
        super_opts = rest[2].split(",") if len(rest) > 2 else []
        out.append(Mount(fields[2], _unescape(fields[3]), _unescape(fields[4]),
                         frozenset(fields[5].split(",")) | frozenset(super_opts), rest[0]))
    return out


@dataclass(frozen=True, slots=True)
class ProcMounts:
    """The mount table of the proc filesystem at ``proc`` (this process's view)."""

    proc: Path = Path("/proc")

    def all(self) -> list[Mount]:
        """Every mount; [] if the table cannot be read."""
        try:
            return parse_mountinfo((self.proc / "self" / "mountinfo").read_text())
        except OSError:
            return []

    def mount_of(self, dev: int) -> tuple[str, bool]:
        """(mountpoint, mounted with -o discard) of the filesystem on the device (kernel dev_t) mounted at its
        root, or ('', False)."""
        want = "{}:{}".format(*kdev_major_minor(dev))
        for m in self.all():
            if m.dev == want and m.root == "/":
                return m.mountpoint, "discard" in m.options
        return "", False

    def fs_type(self, dev: int) -> str | None:
        """The type of the filesystem mounted from dev (None: not mounted here, or mounted as several types)."""
        want = "{}:{}".format(*kdev_major_minor(dev))
        types = {m.fstype for m in self.all() if m.dev == want}
        return types.pop() if len(types) == 1 else None
