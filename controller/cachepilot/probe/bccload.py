"""The bcc capture path (kernels without BTF): compile bpf/cachepilot.bcc.c with bcc against the kernel's headers,
once per kernel release and source (cached), then create the CO-RE object's maps, load the programs as raw
tracepoints and attach them. User space past this point is the CO-RE path's (Probe binds the same map names).

bcc is only the compiler here: the source names its maps by placeholder numbers (bpf/cachepilot.bcc.c, CP_MAP), and
the instructions bcc produced are kept in the cache; a start with a cached compile needs neither bcc nor clang (the
30-45 s of a compile under the lab's TCG become a file read).
"""

from __future__ import annotations

import ctypes as C
import hashlib
import json
import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cachepilot.errors import UserError
from cachepilot.probe import libbpf, perfattach
from cachepilot.probe.capture import HEADERS_ENV, SYSTEM_PYTHON
from cachepilot.probe.hooks import BCC_PROGRAMS, BY_PROGRAM, PLACED, TWINS
from cachepilot.safeio import read_capped

SOURCE_NAME = "cachepilot.bcc.c"
CHECKOUT_BPF_DIR = Path(__file__).resolve().parents[3] / "bpf"
PACKAGED_BPF_DIR = Path(__file__).resolve().parents[1] / "data" / "bcc"  # the wheel and .deb carry the sources here


def bpf_source_dir(checkout: Path = CHECKOUT_BPF_DIR, packaged: Path = PACKAGED_BPF_DIR) -> Path:
    """Where the bcc build's sources are: the checkout's bpf/ when run from one, else the installed package's copy
    (as the CO-RE object: checks.PACKAGED_OBJECT)."""
    return checkout if (checkout / SOURCE_NAME).is_file() else packaged


COMPILER = Path(__file__).with_name("bcc_compile.py")
# the programs of the bcc build and the tracepoint each attaches to (a raw tracepoint: the CO-RE object's tp_btf, or
# "category/name", a classic tracepoint), the maps its source names by placeholder and those of the bcc build only:
# views of the one table of programs and maps (probe/hooks.py)
PROGRAMS = BCC_PROGRAMS
PLACEHOLDER = 0x43500000
# kernel functions the attribution compares a bio's completion with (cp_ksyms, by index)
KSYMS = ("iomap_dio_bio_end_io", "bio_chain_endio")
KALLSYMS = Path("/proc/kallsyms")
COMPILE_TIMEOUT_S = 600
CACHE_CAP = 4 << 20  # a cached compile is ~100 KiB of hex
BPF_PSEUDO_MAP_FD = 1
LD_IMM64 = 0x18
BPF_PROG_TYPE_TRACEPOINT, BPF_PROG_TYPE_RAW_TRACEPOINT = 5, 17
MAP_ARRAY, MAP_ARRAY_OF_MAPS, MAP_TASK_STORAGE = 2, 12, 29
DEFAULT_CACHE = Path(os.environ.get("CACHEPILOT_BCC_CACHE", "/var/cache/cachepilot/bcc"))
DIO_HOOK = "syscalls"  # the bcc build's direct-I/O marks (iomap's keep theirs in task storage, which needs BTF)
NOT_BUILT = "not in the bcc build (kernel without BTF)"


def is_classic(program: str) -> bool:
    """A classic tracepoint's program (CATEGORY/NAME), else a raw tracepoint's."""
    return BY_PROGRAM[program].classic


def cflags(bpf_dir: Path) -> list[str]:
    # the int conversions are BPF_PROG's: the raw arguments (u64 words) handed to typed parameters
    return [f"-I{bpf_dir}", "-Wno-int-conversion",
            *(f"-DCP_FD_{n}={PLACEHOLDER + i}" for i, n in enumerate(PLACED)),
            *(f"-DCP_KSYM_{k}={i}" for i, k in enumerate(("IOMAP_DIO", "BIO_CHAIN")))]


def source_digest(bpf_dir: Path) -> str:
    """What the compile depends on besides the headers: the source, every header it may include, the flags."""
    h = hashlib.sha256()
    for f in sorted([bpf_dir / SOURCE_NAME, bpf_dir / "cachepilot.h", *bpf_dir.glob("*.bpf.h")]):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(json.dumps([cflags(Path("")), PROGRAMS]).encode())
    return h.hexdigest()[:16]


def cache_file(cache_dir: Path, release: str, bpf_dir: Path | None = None) -> Path:
    return cache_dir / f"{release}-{source_digest(bpf_dir or bpf_source_dir())}.json"


def _read_cache(path: Path) -> dict[str, bytes] | None:
    """The cached instructions, or None if absent or not a whole compile of today's programs (then compiled again)."""
    try:
        raw = json.loads(read_capped(path, "bcc compile cache", CACHE_CAP))
        code = {name: bytes.fromhex(raw[name]) for name in PROGRAMS}
    except (UserError, ValueError, KeyError, TypeError):
        return None
    return code if all(c and len(c) % 8 == 0 for c in code.values()) else None


def _compile_env(headers: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != HEADERS_ENV}
    # one merged tree: tell bcc where; Debian's split /lib/modules/<release>/{build,source}: bcc finds it itself
    if (headers / "include" / "linux" / "kconfig.h").is_file():
        env[HEADERS_ENV] = str(headers)
    return env


def compiled(headers: Path, release: str, cache_dir: Path, *, bpf_dir: Path | None = None,
             python: Path = SYSTEM_PYTHON) -> tuple[dict[str, bytes], bool]:
    """Each program's instructions, and whether they came from the cache (else bcc compiled them now)."""
    bpf_dir = bpf_dir or bpf_source_dir()
    source = bpf_dir / SOURCE_NAME
    if not source.is_file():
        raise UserError(f"the bcc source {source} is missing (a checkout's bpf/ or the package's data/bcc/)")
    path = cache_file(cache_dir, release, bpf_dir)
    code = _read_cache(path)
    if code is not None:
        return code, True
    try:
        cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        r = subprocess.run([str(python), str(COMPILER), str(source), str(path), *PROGRAMS, "--", *cflags(bpf_dir)],
                           capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, env=_compile_env(headers),
                           check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"bcc could not compile {source.name}: {exc}") from None
    code = _read_cache(path) if r.returncode == 0 else None
    if code is None:
        why = next((ln for ln in reversed(r.stderr.splitlines()) if ln.strip()), f"exit {r.returncode}")
        raise UserError(f"bcc could not compile {source.name} against {headers}: {why}")
    return code, False


@dataclass(frozen=True)
class MapSpec:
    type: int
    key: int
    value: int
    entries: int
    flags: int


def map_specs(h: C.CDLL, object_path: Path, names: Iterable[str]) -> dict[str, MapSpec]:
    """The maps' definitions, from the CO-RE object (opened, not loaded: that needs no BTF): one definition for both
    paths. Task storage needs BTF and serves CO-RE-only programs: left out."""
    obj = h.bpf_object__open_file(str(object_path).encode(), None)
    if not obj:
        raise UserError(f"cannot open {object_path}: {libbpf.errno_str(C.get_errno())}")
    try:
        specs: dict[str, MapSpec] = {}
        for name in names:
            m = h.bpf_object__find_map_by_name(obj, name.encode())
            if not m:
                raise UserError(f"map {name} missing from {object_path}: rebuild with 'make bpf'")
            spec = MapSpec(h.bpf_map__type(m), h.bpf_map__key_size(m), h.bpf_map__value_size(m),
                           h.bpf_map__max_entries(m), h.bpf_map__map_flags(m))
            if spec.type != MAP_TASK_STORAGE:
                specs[name] = spec
        specs["cp_ksyms"] = MapSpec(MAP_ARRAY, 4, 8, len(KSYMS), 0)
        specs.update({twin: specs[of] for twin, of in TWINS.items()})
        return specs
    finally:
        h.bpf_object__close(obj)


class _MapCreateOpts(C.Structure):
    _fields_ = [("sz", C.c_size_t), ("btf_fd", C.c_uint32), ("btf_key_type_id", C.c_uint32),
                ("btf_value_type_id", C.c_uint32), ("btf_vmlinux_value_type_id", C.c_uint32),
                ("inner_map_fd", C.c_uint32), ("map_flags", C.c_uint32), ("map_extra", C.c_uint64),
                ("numa_node", C.c_uint32), ("map_ifindex", C.c_uint32)]


class _ProgLoadOpts(C.Structure):
    _fields_ = [("sz", C.c_size_t), ("attempts", C.c_int), ("expected_attach_type", C.c_uint32),
                ("prog_btf_fd", C.c_uint32), ("prog_flags", C.c_uint32), ("prog_ifindex", C.c_uint32),
                ("kern_version", C.c_uint32), ("attach_btf_id", C.c_uint32), ("attach_prog_fd", C.c_uint32),
                ("attach_btf_obj_fd", C.c_uint32), ("fd_array", C.c_void_p), ("func_info", C.c_void_p),
                ("func_info_cnt", C.c_uint32), ("func_info_rec_size", C.c_uint32), ("line_info", C.c_void_p),
                ("line_info_cnt", C.c_uint32), ("line_info_rec_size", C.c_uint32), ("log_level", C.c_uint32),
                ("log_size", C.c_uint32), ("log_buf", C.c_char_p)]


def patch(code: bytes, fds: dict[int, int]) -> bytes:
    """The instructions with each placeholder map reference replaced by its map's file descriptor."""
    buf = bytearray(code)
    for off in range(0, len(buf) - 8, 8):
        if buf[off] == LD_IMM64 and buf[off + 1] >> 4 == BPF_PSEUDO_MAP_FD:
            ph = int.from_bytes(buf[off + 4 : off + 8], "little", signed=True)
            if ph not in fds:
                raise UserError(f"the bcc build references an unknown map (placeholder {ph:#x}): rebuild the cache")
            buf[off + 4 : off + 8] = fds[ph].to_bytes(4, "little", signed=True)
    return bytes(buf)


def kallsyms(names: Iterable[str], path: Path = KALLSYMS) -> dict[str, int]:
    """Addresses of kernel symbols (absent: not in the result)."""
    want, out = set(names), {}
    with open(path, "rb") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2].decode(errors="replace") in want:
                out[parts[2].decode()] = int(parts[0], 16)
    return out


@dataclass
class BccPrograms:
    """The maps, programs and attachments of the bcc path (Probe decides what to attach when, as for the CO-RE
    object): close() releases them (detaching the programs)."""

    map_fds: dict[str, int] = field(default_factory=dict)
    progs: dict[str, int] = field(default_factory=dict)  # loaded programs: name -> descriptor
    failed: dict[str, str] = field(default_factory=dict)  # not loaded: name -> why
    from_cache: bool = False
    cache_dir: Path = DEFAULT_CACHE
    verifier_logs: dict[str, str] = field(default_factory=dict)  # programs the kernel refused: its verifier's log
    _fds: list[int] = field(default_factory=list)

    def describe(self) -> str:
        return f"bcc ({'compile from the cache' if self.from_cache else 'compiled now'}: {self.cache_dir})"

    def create_maps(self, h: C.CDLL, specs: dict[str, MapSpec], sizes: dict[str, int]) -> None:
        # the inner map of a map-in-map first (grace needs grace_inner's fd)
        for name in sorted(specs, key=lambda n: specs[n].type == MAP_ARRAY_OF_MAPS):
            s = specs[name]
            opts = _MapCreateOpts(sz=C.sizeof(_MapCreateOpts), map_flags=s.flags)
            if s.type == MAP_ARRAY_OF_MAPS:
                opts.inner_map_fd = self.map_fds["grace_inner"]
            fd = h.bpf_map_create(s.type, name.encode(), s.key, s.value, sizes.get(name, s.entries), C.byref(opts))
            if fd < 0:
                raise UserError(f"cannot create map {name}: {libbpf.errno_str(fd)}")
            self.map_fds[name] = fd
            self._fds.append(fd)

    def fill_ksyms(self, h: C.CDLL) -> None:
        addrs = kallsyms(KSYMS)
        for i, sym in enumerate(KSYMS):
            addr = C.c_uint64(addrs.get(sym, 0))
            h.bpf_map_update_elem(self.map_fds["cp_ksyms"], C.byref(C.c_uint32(i)), C.byref(addr), 0)

    def _load(self, h: C.CDLL, name: str, code: bytes) -> int:
        kind = BPF_PROG_TYPE_TRACEPOINT if is_classic(name) else BPF_PROG_TYPE_RAW_TRACEPOINT
        insns = C.create_string_buffer(code, len(code))
        fd = int(h.bpf_prog_load(kind, name[:15].encode(), b"GPL", insns, len(code) // 8, None))
        if fd >= 0:
            return fd
        log = C.create_string_buffer(1 << 22)
        opts = _ProgLoadOpts(sz=C.sizeof(_ProgLoadOpts), log_level=1, log_size=len(log),
                             log_buf=C.cast(log, C.c_char_p))
        h.bpf_prog_load(kind, name[:15].encode(), b"GPL", insns, len(code) // 8, C.byref(opts))
        self.verifier_logs[name] = log.value.decode(errors="replace")
        last = next((ln for ln in reversed(self.verifier_logs[name].splitlines()) if ln.strip()), "")
        self.failed[name] = f"the kernel refused it: {libbpf.errno_str(fd)} ({last[:200]})"
        return -1

    def load(self, h: C.CDLL, code: dict[str, bytes], unavailable: set[str]) -> None:
        """Load every program (the kernel's verifier); a refused one is in failed, with its log in verifier_logs."""
        by_placeholder = {PLACEHOLDER + i: self.map_fds[n] for i, n in enumerate(PLACED)}
        for name in PROGRAMS:
            if name in unavailable:
                self.failed[name] = "marked unavailable"
                continue
            prog = self._load(h, name, patch(code[name], by_placeholder))
            if prog >= 0:
                self._fds.append(prog)
                self.progs[name] = prog

    def attach(self, h: C.CDLL, name: str, tracefs: Path) -> str | None:
        """Attach a loaded program to its tracepoint; None, or why not."""
        tracepoint = PROGRAMS[name]
        if is_classic(name):
            try:
                link = perfattach.attach(self.progs[name], tracefs, tracepoint)
            except perfattach.AttachError as exc:
                return str(exc)
        else:
            link = int(h.bpf_raw_tracepoint_open(tracepoint.encode(), self.progs[name]))
            if link < 0:
                return f"the kernel has no tracepoint {tracepoint} (nor a loaded module with it): " \
                       f"{libbpf.errno_str(link)}"
        self._fds.append(link)
        return None

    def close(self) -> None:
        for fd in reversed(self._fds):  # links first: detaches the programs
            os.close(fd)
        self._fds.clear()
        self.map_fds.clear()


def start(h: C.CDLL, headers: Path, release: str, cache_dir: Path, object_path: Path, maps: Iterable[str],
          sizes: dict[str, int], unavailable: set[str]) -> BccPrograms:
    """The compile (cached or fresh), the maps (sizes: max_entries overriding the object's), every program that
    loads (none attached yet)."""
    code, cached = compiled(headers, release, cache_dir)
    progs = BccPrograms(from_cache=cached, cache_dir=cache_dir)
    try:
        progs.create_maps(h, map_specs(h, object_path, maps), sizes)
        progs.fill_ksyms(h)
        progs.load(h, code, unavailable)
    except BaseException:
        progs.close()
        raise
    return progs
