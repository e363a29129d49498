"""The programs' configuration (the "cp_config_map" element): written as a whole, and switched under a grace period
when the programs must not see the old one any more."""

from __future__ import annotations

import ctypes as C
import os
import secrets
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

    def claim_self(self) -> tuple[int, str]:
        """Tell the kernel which tgid is ours, in its own terms (our getpid() is wrong in a PID namespace): see
        CP_SELF_CLAIM_FD in bpf/cachepilot.h. Returns (that tgid, how it was found); from now on the programs
        ignore its I/O."""
        self.cfg.nonce = secrets.randbits(62) | 1
        self.write()
        libc = C.CDLL(None, use_errno=True)
        sfr = libc.sync_file_range
        sfr.argtypes = [C.c_int, C.c_int64, C.c_int64, C.c_uint]
        sfr(L.SELF_CLAIM_FD, self.cfg.nonce, 0, 0)  # EBADF by design
        seen = L.cp_config()
        self.maps.lookup("cp_config_map", C.c_uint32(0), seen)
        self.cfg.nonce = 0
        if seen.nonce == 0 and seen.self_tgid:
            tgid, how = seen.self_tgid, "claimed in the kernel"
        else:  # the claim hook is missing: getpid() is right outside PID namespaces only
            tgid, how = os.getpid(), "getpid() (wrong inside a PID namespace)"
        self.cfg.self_tgid = tgid
        self.cfg.flags |= L.CFG_IGNORE_SELF
        self.tick_clock()
        return tgid, how
