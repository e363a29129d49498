"""The loader: the host's checks, the capture path (the CO-RE object, or the bcc build on a kernel without BTF), the
programs this kernel can run and the variants used, load, attach now or when a watch needs them, and the report of
what is attached and why not. The runtime over the loaded maps is probe/probe.py's.

    loader = Loader(object_path, report, ...)
    fds = loader.load(btf_path, dio_hook, unavailable)   # map name -> fd, on either path
    ...                                                   # the runtime binds the maps (the configuration first)
    loader.attach(sync_syscalls_on)                      # every loaded program but those deferred
    loader.check_required()                              # UserError if the probe cannot work
    loader.attach_deferred(STACKED)                      # later, when a watch needs them
    loader.detach(); loader.close()
"""

from __future__ import annotations

import ctypes as C
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cachepilot.errors import UserError
from cachepilot.probe import bccload, capture, libbpf
from cachepilot.probe.bccload import BccPrograms
from cachepilot.probe.checks import (
    TRACEFS,
    VMLINUX_BTF,
    WORKS_WITHOUT,
    KernelFeatures,
    has_kernel_symbol,
    mount_tracefs,
    requirements,
)
from cachepilot.probe.hooks import (
    BIO_COMPAT,
    BIO_FAST,
    BY_PROGRAM,
    DIO_IOMAP,
    DIO_SYSCALLS,
    EXT4_SYNC,
    FSYNC_SYSCALLS,
    HOOKS,
    MAPS,
    MODULE_HOOKS,
    map_sizes,
)
from cachepilot.probe.watches import NOT_EXT4, STACKED

DEFERRED_UNTIL = {
    STACKED: "direct I/O marks: attached when a stacked volume is watched",
    NOT_EXT4: "fsync-family system calls: attached when a filesystem other than ext4 is watched",
}


@dataclass
class AttachReport:
    """What is attached, what is not and why. A partial attach is reported here (and by `cachepilot probe`)."""

    kernel: str
    capture: str = "core"  # the capture path (probe/capture.py); for bcc, whether its compile came from the cache
    dio_hook: str = ""
    self_id: str = "not ignored"
    attached: list[str] = field(default_factory=list)
    disabled: dict[str, str] = field(default_factory=dict)  # by choice (e.g. the other direct I/O variant)
    failed: dict[str, str] = field(default_factory=dict)  # wanted but unavailable: program -> reason

    @property
    def partial(self) -> bool:
        return bool(self.failed)

    def missing_features(self) -> list[str]:
        """Features with a program that failed: a feature needs all its programs (a durability call's entry and
        exit; every read/write syscall of the direct I/O fallback)."""
        return sorted({BY_PROGRAM[p].feature for p in self.failed})

    def bcc(self, b: BccPrograms) -> None:
        """The bcc path: its build of the hooks (the others are the CO-RE object's only), those the kernel refused."""
        self.capture, self.dio_hook = b.describe(), bccload.DIO_HOOK
        self.failed.update(b.failed)
        self.disabled.update(dict.fromkeys((hk.program for hk in HOOKS if not hk.bcc), bccload.NOT_BUILT))

    def summary(self) -> str:
        lines = [
            f"kernel {self.kernel}; capture: {self.capture}; direct I/O attribution: {self.dio_hook or 'none'}; "
            f"own I/O: {self.self_id}"
        ]
        lines.append(f"attached: {', '.join(self.attached) or 'nothing'}")
        for prog, why in sorted(self.failed.items()):
            lines.append(f"NOT attached: {prog}: {why}")
        missing = self.missing_features()
        if missing:
            lines.append("missing features: " + "; ".join(missing))
        return "\n".join(lines)


def deferrals(loaded: dict[str, int], dio_hook: str, ext4_sync: bool) -> dict[str, dict[str, int]]:
    """The loaded programs that wait for a watch needing them, by trigger (Loader.attach_deferred); ext4_sync:
    ext4's own fsync hooks are there."""
    deferred: dict[str, dict[str, int]] = {}
    # iomap's direct-I/O bios name their file themselves (bi_private): the per-task marks are only needed for the
    # clones device-mapper makes below a stacked filesystem, so their hooks (one run per read/write) wait for one
    marks = DIO_IOMAP if dio_hook == "iomap" else DIO_SYSCALLS
    if has_kernel_symbol("iomap_dio_bio_end_io"):
        deferred[STACKED] = {n: p for n, p in loaded.items() if n in marks}
    # ext4's own fsync hooks count the fsync-family calls on ext4 (the kind from the system call); the syscall
    # tracepoints, a run per fsync of every task (1.3 us here), are needed only for other filesystems
    if ext4_sync:
        deferred[NOT_EXT4] = {n: p for n, p in loaded.items() if n in FSYNC_SYSCALLS}
    return deferred


def _bcc_attachable(progs: dict[str, int], tracefs_problem: str | None, report: AttachReport) -> dict[str, int]:
    """The bcc build's loaded programs that can attach here: without tracefs no classic tracepoint can (failed), a
    module's absent tracepoint is the module not loaded (disabled, as the object's: Loader._select)."""
    loaded = dict(progs)
    for name in [n for n in loaded if BY_PROGRAM[n].classic]:
        tracepoint, module = BY_PROGRAM[name].tracepoint, MODULE_HOOKS.get(name)
        if tracefs_problem or (module and not (TRACEFS / "events" / tracepoint).is_dir()):
            why = tracefs_problem or f"{module} is not loaded: the kernel has no tracepoint {tracepoint}"
            (report.failed if tracefs_problem else report.disabled)[name] = why
            del loaded[name]
    return loaded


class Loader:
    """The kernel half loaded on one capture path, its programs attached (now or deferred) and reported in
    ``report``. Sizes: ``nslots`` slots per half of the hotness table, rings of ``ringbuf_bytes``."""

    def __init__(self, object_path: Path, report: AttachReport, *, nslots: int, ringbuf_bytes: int,
                 bcc_cache: Path) -> None:
        self.object_path, self.report = object_path, report
        self.nslots, self.ringbuf_bytes, self.bcc_cache = nslots, ringbuf_bytes, bcc_cache
        self._obj: int | None = None
        self._links: list[int] = []
        self._progs: dict[str, int] = {}  # every program of the object, by name
        # loaded programs attached only when a watch needs them: trigger -> {program: handle}
        self._deferred: dict[str, dict[str, int]] = {}
        self._bcc: BccPrograms | None = None  # the bcc path's maps and programs
        self._sync_syscalls_on: Callable[[], None] = lambda: None

    # ---- checks, selection, load ----
    def load(self, btf_path: Path, dio_hook: str, unavailable: set[str]) -> dict[str, int]:
        """Feature checks, program selection, load: the maps' descriptors by name, or a UserError naming what is
        missing. The direct-I/O variant chosen is in report.dio_hook."""
        self.h, chosen = requirements(self.object_path, btf_path)
        self.capture = chosen
        self.capture_path = chosen.path  # which capture path runs: core or bcc
        if self.capture_path == capture.BCC:
            return self._load_bcc(unavailable)
        reasons = self._open_object(btf_path, unavailable)
        self._select(reasons, dio_hook)
        return self._load_object()

    def _open_object(self, btf_path: Path, unavailable: set[str]) -> dict[str, str | None]:
        """Open the object and say, per program, why this kernel cannot run it (None: it can)."""
        h = self.h
        vmlinux = h.btf__load_vmlinux_btf() if btf_path == VMLINUX_BTF else h.btf__parse(str(btf_path).encode(), None)
        if not vmlinux:
            err = libbpf.errno_str(C.get_errno())
            raise UserError(f"cannot read the kernel BTF {btf_path}: {err}; {WORKS_WITHOUT}")
        try:
            libbpf.clear_log()
            obj = h.bpf_object__open_file(str(self.object_path).encode(), None)
            if not obj:
                raise UserError(f"cannot open {self.object_path}: {libbpf.errno_str(C.get_errno())}")
            self._obj = obj
            p = h.bpf_object__next_program(obj, None)
            while p:
                self._progs[h.bpf_program__name(p).decode()] = p
                p = h.bpf_object__next_program(obj, p)
            features = KernelFeatures(h, vmlinux, btf_path, mount_tracefs())
            try:
                return {name: features.missing(name, self._section(name), unavailable) for name in self._progs}
            finally:
                features.close()
        finally:
            h.btf__free(vmlinux)

    def _section(self, name: str) -> str:
        return str(self.h.bpf_program__section_name(self._progs[name]).decode())

    def _select(self, reasons: dict[str, str | None], dio_hook: str) -> None:
        """Turn off what this kernel lacks and the direct-I/O variant not used; the variant used is reported."""
        h = self.h
        if dio_hook == "auto":
            dio_hook = "iomap" if all(reasons.get(n) is None for n in DIO_IOMAP) else "syscalls"
        self.report.dio_hook = dio_hook
        unused_dio = DIO_SYSCALLS if dio_hook == "iomap" else DIO_IOMAP
        off = dict.fromkeys(unused_dio, f"direct I/O attribution uses {dio_hook}")
        # the block I/O variant: with bpf_rdonly_cast where the kernel has it (plain loads instead of probe reads)
        if reasons.get(BIO_FAST) is None:
            off[BIO_COMPAT] = f"block I/O uses {BIO_FAST}"
        elif reasons.get(BIO_COMPAT) is None:
            off[BIO_FAST] = f"block I/O uses {BIO_COMPAT}: {reasons[BIO_FAST]}"
        for name, prog in self._progs.items():
            if name in off:
                self.report.disabled[name] = off[name]
                h.bpf_program__set_autoload(prog, False)
            elif reasons[name]:
                module = MODULE_HOOKS.get(name)
                why = self.report.disabled if module else self.report.failed
                why[name] = f"{module} is not loaded: {reasons[name]}" if module else str(reasons[name])
                h.bpf_program__set_autoload(prog, False)

    def _load_object(self) -> dict[str, int]:
        h = self.h
        for name, n in map_sizes(self.nslots, self.ringbuf_bytes).items():
            self._set_max_entries(name, n)
        rc = h.bpf_object__load(self._obj)
        if rc:
            # one line; libbpf's own log (the verifier's output) stays in libbpf.log_tail() for debugging
            raise UserError(
                f"loading {self.object_path.name} failed: {libbpf.errno_str(rc)} (libbpf's log: "
                "cachepilot.probe.libbpf.log_tail())"
            )
        return {name: h.bpf_map__fd(self._map(name)) for name in MAPS}

    def _load_bcc(self, unavailable: set[str]) -> dict[str, int]:
        """The bcc path: the cached (or a fresh) compile, the same maps, every program that loads (attached as the
        object's are, with the same deferrals: attach)."""
        assert self.capture.headers is not None  # capture.select gives bcc headers
        b = self._bcc = bccload.start(self.h, self.capture.headers, self.report.kernel, self.bcc_cache,
                                      self.object_path, MAPS, map_sizes(self.nslots, self.ringbuf_bytes), unavailable)
        self.report.bcc(b)
        return b.map_fds

    def _map(self, name: str) -> int:
        m = self.h.bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise UserError(f"map {name} missing from {self.object_path}: rebuild with 'make bpf'")
        return m

    def _set_max_entries(self, name: str, n: int) -> None:
        rc = self.h.bpf_map__set_max_entries(self._map(name), n)
        if rc:
            raise UserError(f"cannot size map {name} to {n}: {libbpf.errno_str(rc)}")

    # ---- attach ----
    def attach(self, sync_syscalls_on: Callable[[], None]) -> None:
        """Attach every loaded program but those a watch needs first (attach_deferred). ``sync_syscalls_on`` runs
        before the fsync-family syscall hooks attach (the programs' configuration must say so first)."""
        self._sync_syscalls_on = sync_syscalls_on
        if self._bcc is not None:
            # tp_btf's as raw tracepoints, the classic ones through perf events
            loaded = _bcc_attachable(self._bcc.progs, mount_tracefs(), self.report)
            ext4_sync = all(n in loaded and self._attach_one(n, loaded.pop(n)) for n in EXT4_SYNC)
            self._deferred = deferrals(loaded, bccload.DIO_HOOK, ext4_sync)
        else:
            loaded = {n: p for n, p in self._progs.items() if self.h.bpf_program__autoload(p)}
            self._deferred = deferrals(loaded, self.report.dio_hook, all(n in loaded for n in EXT4_SYNC))
        self._attach_loaded(loaded)

    def _attach_loaded(self, loaded: dict[str, int]) -> None:
        """Attach every loaded program but those deferred (either path's: libbpf's handles or bcc's descriptors)."""
        if not self._deferred.get(NOT_EXT4):
            self._sync_syscalls_on()
        for name, prog in loaded.items():
            trigger = next((t for t, progs in self._deferred.items() if name in progs), None)
            if trigger is not None:
                self.report.disabled[name] = DEFERRED_UNTIL[trigger]
                continue
            self._attach_one(name, prog)

    def _attach_one(self, name: str, prog: int) -> bool:
        """Attach one program (the object's by libbpf, the bcc build's by its loader); reported either way."""
        if self._bcc is not None:
            why = self._bcc.attach(self.h, name, TRACEFS)
        else:
            link = self.h.bpf_program__attach(prog)
            why = None if link else f"attach failed: {libbpf.errno_str(C.get_errno())}"
            if link:
                self._links.append(link)
        if why:
            self.report.failed[name] = why
            return False
        self.report.disabled.pop(name, None)
        self.report.attached.append(name)
        return True

    def attach_deferred(self, trigger: str) -> None:
        """Attach the programs waiting for ``trigger`` (a watch that needs them: watches.STACKED, NOT_EXT4)."""
        progs = self._deferred.get(trigger, {})
        if trigger == NOT_EXT4 and progs:
            self._sync_syscalls_on()
        for name, prog in list(progs.items()):
            if self._attach_one(name, prog):
                del progs[name]

    def check_required(self) -> None:
        attached = {hk.feature for hk in HOOKS if hk.program in self.report.attached}
        required = [hk.program for hk in HOOKS if hk.required and hk.feature not in attached]
        if required:
            raise UserError(
                "the probe cannot work: required hook(s) not attached: "
                + "; ".join(f"{p}: {self._why_not(p)}" for p in required)
                + f"; {WORKS_WITHOUT}"
            )

    def _why_not(self, program: str) -> str:
        return self.report.failed.get(program) or self.report.disabled.get(program, "not in object")

    # ---- lifetime ----
    def detach(self) -> None:
        """Detach the object's programs (the bcc build's detach on close)."""
        for link in self._links:
            self.h.bpf_link__destroy(link)
        self._links = []

    def close(self) -> None:
        """Release the object (its maps and programs) or the bcc build."""
        if self._obj:
            self.h.bpf_object__close(self._obj)
            self._obj = None
        if self._bcc is not None:
            self._bcc.close()
            self._bcc = None
