"""The daemon's own process as ``cachepilot_process_*`` (RSS against the unit's MemoryMax, CPU, open files): the
families, help texts, order and arithmetic of prometheus_client's ``ProcessCollector(namespace="cachepilot")``, read
from ``/proc`` on each scrape (tests/unit/test_exposition.py compares the two on a fixture /proc). The prefix keeps
them apart from node_exporter's own ``process_*`` when the textfile collector carries them."""

from __future__ import annotations

import os

from cachepilot.exporter.families import CounterMetricFamily, GaugeMetricFamily, Metric


def _sysconf(name: str, default: int) -> int:
    try:
        return os.sysconf(name)
    except (ValueError, OSError):
        return default


class ProcessMetrics:
    def __init__(self, namespace: str = "cachepilot", proc: str = "/proc", pid: str = "self") -> None:
        self.prefix = f"{namespace}_process_"
        self.proc = proc
        self.pid = pid
        self.ticks = _sysconf("SC_CLK_TCK", 100)
        self.pagesize = _sysconf("SC_PAGE_SIZE", 4096)
        self.btime = self._boot_time()  # 0: no /proc to read, nothing is reported

    def _boot_time(self) -> float:
        try:
            with open(os.path.join(self.proc, "stat"), "rb") as f:
                for line in f:
                    if line.startswith(b"btime "):
                        return float(line.split()[1])
        except OSError:
            pass
        return 0.0

    def collect(self) -> list[Metric]:
        if not self.btime:
            return []
        where = os.path.join(self.proc, self.pid)
        return self._stat(where) + self._fds(where)

    def _stat(self, where: str) -> list[Metric]:
        try:
            with open(os.path.join(where, "stat"), "rb") as f:
                parts = f.read().split(b")")[-1].split()  # after the command, which may hold spaces and parentheses
        except OSError:
            return []
        p = self.prefix
        return [
            GaugeMetricFamily(p + "virtual_memory_bytes", "Virtual memory size in bytes.", value=float(parts[20])),
            GaugeMetricFamily(p + "resident_memory_bytes", "Resident memory size in bytes.",
                              value=float(parts[21]) * self.pagesize),
            GaugeMetricFamily(p + "start_time_seconds", "Start time of the process since unix epoch in seconds.",
                              value=float(parts[19]) / self.ticks + self.btime),
            CounterMetricFamily(p + "cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                                value=float(parts[11]) / self.ticks + float(parts[12]) / self.ticks),
        ]

    def _fds(self, where: str) -> list[Metric]:
        try:
            with open(os.path.join(where, "limits"), "rb") as f:
                limit = next((line.split()[3] for line in f if line.startswith(b"Max open file")), None)
            opened = len(os.listdir(os.path.join(where, "fd")))
        except OSError:
            return []
        try:
            most = float(limit or b"")
        except ValueError:  # no such line, or no number on it (prometheus_client's scrape then fails)
            return []
        return [GaugeMetricFamily(self.prefix + "open_fds", "Number of open file descriptors.", value=opened),
                GaugeMetricFamily(self.prefix + "max_fds", "Maximum number of open file descriptors.", value=most)]
