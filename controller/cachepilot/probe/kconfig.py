"""The programs' configuration (the "cp_config_map" element): written as a whole, and switched under a grace period
when the programs must not see the old one any more."""

from __future__ import annotations

import ctypes as C
import time

from cachepilot import bpf_layout as L
from cachepilot.probe.maps import MapAccess


class KernelConfig:
    """``cfg`` is the user-space copy; every change is written with :meth:`write` (or :meth:`switch`)."""

    def __init__(self, maps: MapAccess, cfg: L.cp_config) -> None:
        self.maps = maps
        self.cfg = cfg

    def write(self) -> None:
        self.maps.update("cp_config_map", C.c_uint32(0), self.cfg)

    def tick_clock(self) -> None:
        """The kernel stamps hotness with this clock (resolution: the interval between polls)."""
        self.cfg.clock_ns = time.monotonic_ns()
        self.write()

    def switch(self) -> None:
        """Write the config and return once no program still runs with the old one (the grace map's update waits
        for every running program to finish: see "grace" in bpf/common.bpf.h)."""
        self.write()
        self.maps.update("grace", C.c_uint32(0), C.c_uint32(self.maps.fds["grace_inner"]))
