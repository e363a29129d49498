"""What the host must have before the kernel half loads, and which of its programs this kernel can run: the root and
version checks, where the compiled object is, tracefs, kernel symbols, and the tracepoints and kfuncs the kernel's
BTF (vmlinux and loaded modules) has. Each check fails with a UserError naming what is missing."""

from __future__ import annotations

import ctypes as C
import os
import re
import sys
from pathlib import Path

from cachepilot.errors import UserError
from cachepilot.probe import capture, libbpf
from cachepilot.probe.hooks import KFUNCS

REPO_ROOT = Path(__file__).resolve().parents[3]
# Where the compiled object is looked for when no path is configured: the copy a wheel or the Debian package carries
# as package data (`make package` puts it there), then a checkout's build output (`make bpf`, for development).
PACKAGED_OBJECT = Path(__file__).resolve().parents[1] / "data" / "cachepilot.bpf.o"
CHECKOUT_OBJECT = REPO_ROOT / "bpf" / ".output" / "cachepilot.bpf.o"
# What the object needs (docs/install.md): the BPF ring buffer (5.8), libbpf 1.x's API, the Python of pyproject.
MIN_KERNEL = (5, 8)
MIN_LIBBPF = (1, 1)
MIN_PYTHON = (3, 11)
VMLINUX_BTF = capture.VMLINUX_BTF
TRACEFS = Path("/sys/kernel/tracing")
WORKS_WITHOUT = capture.WORKS_WITHOUT


def default_object() -> Path:
    """The packaged object if this install carries one, else the checkout's (which may not be built)."""
    return PACKAGED_OBJECT if PACKAGED_OBJECT.is_file() else CHECKOUT_OBJECT


def _release(text: str) -> tuple[int, int]:
    """(major, minor) of a kernel release string such as 6.1.0-28-amd64; (0, 0) if it has none."""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def too_old(kernel: str, python: tuple[int, ...], libbpf_version: tuple[int, int] | None) -> None:
    """UserError naming the first component older than the object needs (the kernel's release string, the
    interpreter, the system libbpf when known); nothing when all are new enough."""
    have = _release(kernel)
    if have < MIN_KERNEL:
        raise UserError(f"kernel {kernel} is too old: the probe needs {'.'.join(map(str, MIN_KERNEL))} or newer "
                        f"(BPF ring buffer, tp_btf, CO-RE); {WORKS_WITHOUT}")
    if tuple(python[:2]) < MIN_PYTHON:
        raise UserError(f"Python {'.'.join(map(str, python[:2]))} is too old: cachepilot needs "
                        f"{'.'.join(map(str, MIN_PYTHON))} or newer")
    if libbpf_version is not None and libbpf_version < MIN_LIBBPF:
        raise UserError(f"the system libbpf {'.'.join(map(str, libbpf_version))} is too old: the probe needs "
                        f"{'.'.join(map(str, MIN_LIBBPF))} or newer (Debian package libbpf1); {WORKS_WITHOUT}")


def requirements(object_path: Path, btf_path: Path) -> tuple[C.CDLL, capture.Capture]:
    """Root, the capture path this kernel gets, the object, new enough versions, the system libbpf: the library and
    the capture path, or a UserError naming the first thing missing."""
    if os.geteuid() != 0:
        raise UserError(f"the eBPF probe needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN); {WORKS_WITHOUT}")
    chosen = capture.select(btf_path)
    if not object_path.is_file():
        raise UserError(f"BPF object {object_path} not found: set bpf_object in the configuration (or "
                        "--bpf-object), install the package that carries it, or run 'make bpf' in a checkout")
    too_old(os.uname().release, sys.version_info[:2], None)
    try:
        h = libbpf.lib()
    except libbpf.LibbpfMissing as exc:
        raise UserError(f"{exc}; {WORKS_WITHOUT}") from exc
    too_old(os.uname().release, sys.version_info[:2], libbpf.version())
    return h, chosen


def has_kernel_symbol(name: str, kallsyms: str = "/proc/kallsyms") -> bool:
    """The symbol is there *with its address*: without CAP_SYSLOG (the systemd unit's bounding set) kallsyms shows
    every address as 0, libbpf resolves the object's weak ksym to 0, and a hook keyed on it never matches -- then
    the fallback must run, as if the symbol were absent."""
    needle = f" {name}".encode()
    try:
        with open(kallsyms, "rb") as f:
            return any(line.rstrip().endswith(needle) and int(line.split(maxsplit=1)[0], 16) != 0 for line in f)
    except (OSError, ValueError):
        return False


def mount_tracefs() -> str | None:
    """Mount tracefs if it is not; returns a reason string if tracepoint/* programs cannot work."""
    if (TRACEFS / "events").is_dir():
        return None
    libc = C.CDLL(None, use_errno=True)
    rc = libc.mount(b"nodev", str(TRACEFS).encode(), b"tracefs", 0, None)
    if rc != 0 and not (TRACEFS / "events").is_dir():
        err = C.get_errno()
        return f"tracefs is not mounted at {TRACEFS} and mounting it failed: {os.strerror(err)}"
    return None


def _tp_of(section: str) -> tuple[str, str]:
    kind, _, rest = section.partition("/")
    return kind, rest


class KernelFeatures:
    """Which tracepoints this kernel has: BTF (vmlinux and loaded modules) for tp_btf, tracefs for tracepoint."""

    def __init__(self, h: C.CDLL, vmlinux: int, btf_path: Path, tracefs_problem: str | None) -> None:
        self._h, self._vmlinux, self._btf_path, self._tracefs_problem = h, vmlinux, btf_path, tracefs_problem
        self._modules: list[int] | None = None

    def has_btf_tracepoint(self, tp: str) -> bool:
        """In vmlinux, or in a loaded module's BTF (ext4 and jbd2 are modules on distribution kernels)."""
        h = self._h
        name, kind = f"btf_trace_{tp}".encode(), libbpf.BTF_KIND_TYPEDEF
        if h.btf__find_by_name_kind(self._vmlinux, name, kind) >= 0:
            return True
        if self._btf_path != VMLINUX_BTF:
            return False
        if self._modules is None:
            self._modules = []
            for f in sorted(self._btf_path.parent.iterdir()):
                if f.name != "vmlinux":
                    b = h.btf__parse_split(str(f).encode(), self._vmlinux)
                    if b:
                        self._modules.append(b)
        return any(h.btf__find_by_name_kind(b, name, kind) >= 0 for b in self._modules)

    def missing(self, name: str, section: str, unavailable: set[str]) -> str | None:
        """Why program `name` (in `section`) cannot run here, or None."""
        if name in unavailable:
            return "marked unavailable"
        kfunc = KFUNCS.get(name)
        if kfunc and self._h.btf__find_by_name_kind(self._vmlinux, kfunc.encode(), libbpf.BTF_KIND_FUNC) < 0:
            return f"the kernel has no kfunc {kfunc} (Linux < 6.2)"
        kind, tp = _tp_of(section)
        if kind == "tp_btf" and not self.has_btf_tracepoint(tp):
            return f"the kernel has no tracepoint {tp} (nor a loaded module with it)"
        if kind == "tracepoint":
            if self._tracefs_problem:
                return self._tracefs_problem
            if not (TRACEFS / "events" / tp).is_dir():
                hint = " (CONFIG_FTRACE_SYSCALLS?)" if tp.startswith("syscalls/") else ""
                return f"the kernel has no tracepoint {tp}{hint}"
        return None

    def close(self) -> None:
        for b in self._modules or []:
            self._h.btf__free(b)
