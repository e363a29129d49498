"""The daemon's own cost on an idle host: `cachepilot run` with the real probe, observe-only (this host has no
cache), 1 s tick. Prints the CPU it used over a window (utime + stime from /proc), its RSS, and the latency of
`status` over the control socket (in-process client, 200 requests).

Usage: .venv/bin/python tests/bench/bench_daemon.py [SECONDS]   (root: the probe loads BPF programs)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cachepilot.daemon.control import request

CLI = Path(sys.executable).with_name("cachepilot")


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    window = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    (tmp / "c.yaml").write_text("version: 1\nstate_dir: state\nsocket: ctl.sock\nmetrics: {listen: ''}\n")
    p = subprocess.Popen([str(CLI), "run", "--config", str(tmp / "c.yaml")], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp / "ctl.sock").exists():
            if time.monotonic() > deadline or p.poll() is not None:
                raise SystemExit("the daemon did not start")
            time.sleep(0.2)
        time.sleep(3)
        c0 = cpu_s(p.pid)
        time.sleep(window)
        used = cpu_s(p.pid) - c0
        lat = []
        for _ in range(200):
            t = time.perf_counter()
            request(tmp / "ctl.sock", {"cmd": "status"})
            lat.append(time.perf_counter() - t)
        lat.sort()
        rss = next(line.split()[1] for line in Path(f"/proc/{p.pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS"))
        print(f"idle daemon: {used / window * 100:.2f}% of a core over {window:.0f} s (goal <= 1%), "
              f"RSS {int(rss) // 1024} MiB")
        print(f"status: p50 {lat[100] * 1e3:.2f} ms, p99 {lat[197] * 1e3:.2f} ms, max {lat[-1] * 1e3:.2f} ms "
              "(goal <= 200 ms)")
        print(f"load average during the run: {os.getloadavg()[0]:.1f}")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)


if __name__ == "__main__":
    main()
