"""Which capture path a kernel gets: the CO-RE object where the kernel has BTF, else the same programs compiled by
bcc against the running kernel's headers, else one line saying what is missing.

    core  /sys/kernel/btf/vmlinux exists: libbpf loads bpf/.output/cachepilot.bpf.o and relocates it (CO-RE)
    bcc   no BTF, but bcc (Debian's python3-bpfcc) and this release's headers are installed: bpf/cachepilot.bcc.c is
          compiled once per kernel release and source (cached, see probe/bccload.py) and loaded with the same maps
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cachepilot.errors import UserError

CORE, BCC = "core", "bcc"
VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
MODULES = Path("/lib/modules")
# bcc's Python binding is Debian's python3-bpfcc: pure Python over libbcc.so.0, importable from the system interpreter
SYSTEM_PYTHON = Path("/usr/bin/python3")
BCC_PACKAGE = Path("/usr/lib/python3/dist-packages/bcc/__init__.py")
# bcc's own override of the headers' directory (a tree unpacked elsewhere than /lib/modules)
HEADERS_ENV = "BCC_KERNEL_SOURCE"
WORKS_WITHOUT = "without it cachepilot runs blind (policy, backends and dry-run on recorded traces still work)"


@dataclass(frozen=True)
class Capture:
    """The path chosen, and for bcc the kernel headers it compiles against."""

    path: str
    headers: Path | None = None


def _has_headers(tree: Path) -> bool:
    """A configured kernel tree: Debian splits it in two (build: the generated headers, source: the rest)."""
    generated = tree / "include" / "generated" / "autoconf.h"
    fs_h = [tree / "include" / "linux" / "fs.h", tree.parent / "source" / "include" / "linux" / "fs.h"]
    return generated.is_file() and any(p.is_file() for p in fs_h)


def kernel_headers(release: str, modules: Path = MODULES, env: Mapping[str, str] = os.environ) -> Path | None:
    """The headers of `release`: $BCC_KERNEL_SOURCE if set, else /lib/modules/<release>/build; None if absent."""
    tree = Path(env[HEADERS_ENV]) if env.get(HEADERS_ENV) else modules / release / "build"
    return tree if _has_headers(tree) else None


def select(
    btf: Path = VMLINUX_BTF,
    release: str | None = None,
    *,
    bcc_package: Path = BCC_PACKAGE,
    modules: Path = MODULES,
    env: Mapping[str, str] = os.environ,
) -> Capture:
    """CO-RE if the kernel has BTF, else bcc if it can compile here, else UserError naming what is missing."""
    if btf.is_file():
        return Capture(CORE)
    release = release or os.uname().release
    no_btf = f"the kernel has no BTF ({btf} missing, CONFIG_DEBUG_INFO_BTF=n)"
    if not bcc_package.is_file():
        raise UserError(f"{no_btf} and bcc is not installed for the fallback (Debian package python3-bpfcc); "
                        f"{WORKS_WITHOUT}")
    headers = kernel_headers(release, modules, env)
    if headers is None:
        where = env.get(HEADERS_ENV) or str(modules / release / "build")
        raise UserError(f"{no_btf} and the bcc fallback has no kernel headers for {release} at {where} (Debian "
                        f"package linux-headers-{release}); {WORKS_WITHOUT}")
    return Capture(BCC, headers)
