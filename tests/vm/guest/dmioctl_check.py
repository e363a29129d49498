"""Guest: every dm device's status and table through the DM ioctl (cachepilot.backends.dmioctl) against what
dmsetup prints, the time of each way, and a vanished device's class. key=value lines on stdout."""

from __future__ import annotations

import subprocess
import time

from cachepilot.backends import dmioctl
from cachepilot.backends.kernelio import run_dmsetup
from cachepilot.errors import DeviceGone


def _compare(name: str, table: bool, argv: tuple[str, ...]) -> tuple[str, str]:
    """The ioctl's line and dmsetup's, read while the device stood still: a cache writing back changes its status
    (dirty count, demotions) between two reads, so dmsetup's line is read between two ioctl reads and a try in which
    those two differ (the device moved) is made again. A line dmsetup prints that neither ioctl read bracketing it
    shows is a real difference."""
    for _ in range(40):
        before = dmioctl.read(name, table=table)
        want = run_dmsetup(argv, 30)
        after = dmioctl.read(name, table=table)
        if want in (before, after):
            return want, want
        if before == after:
            return before, want
        time.sleep(0.25)
    return after, want


def main() -> None:
    names = [line.split()[0] for line in run_dmsetup(("ls",), 30).splitlines() if line.strip()]
    print(f"devices={' '.join(names)}")
    same = 0
    for name in names:
        for table, argv in ((False, ("status", "--noflush", name)), (True, ("table", name))):
            got, want = _compare(name, table, argv)
            same += got == want
            if got != want:
                print(f"differs_{name}_{'table' if table else 'status'}={got!r} != {want!r}")
    from cachepilot.backends.host import Host
    listing = Host(dm=lambda args, timeout: run_dmsetup(args, timeout)).dm_tables()
    same += Host().dm_tables() == listing  # the rescan's listing: through the ioctl, and dmsetup's own
    print(f"same={same}")
    print(f"compared={2 * len(names) + 1}")
    n, name = 20, names[0]
    t = time.perf_counter()
    for _ in range(n):
        dmioctl.read(name, table=False)
    print(f"ioctl_ms={(time.perf_counter() - t) / n * 1e3:.3f}")
    t = time.perf_counter()
    for _ in range(n):
        subprocess.run(["dmsetup", "status", name], capture_output=True, check=True)
    print(f"dmsetup_ms={(time.perf_counter() - t) / n * 1e3:.3f}")
    try:
        dmioctl.read("no-such-dm-device", table=False)
        print("gone=none")
    except DeviceGone as exc:
        print(f"gone={type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
