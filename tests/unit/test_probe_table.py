"""The one table of the kernel half's programs and maps (probe/hooks.py) is what both capture paths read: the CO-RE
loader's selection and the bcc build's programs, placeholders and twins are views of it, and it agrees with the bcc
source. (That each hook's tracepoint is the object's own section: tests/bpf/test_layout.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from cachepilot.probe import bccload, hooks, loader
from cachepilot.probe.hooks import HOOKS, MAP_TABLE, MAPS, PLACED

BCC_SOURCE = Path(__file__).resolve().parents[2] / "bpf" / bccload.SOURCE_NAME


def test_each_program_and_map_is_declared_once() -> None:
    assert len({h.program for h in HOOKS}) == len(HOOKS)
    assert len({m.name for m in MAP_TABLE}) == len(MAP_TABLE)


def test_the_bcc_build_is_the_tables_bcc_rows() -> None:
    """The bcc build's programs (compiled, loaded, attached by tracepoint) are the hooks the table marks bcc, in the
    table's order (its compile cache's key), each at the hook's tracepoint."""
    assert list(bccload.PROGRAMS.items()) == [(h.program, h.tracepoint) for h in HOOKS if h.bcc]
    assert all(bccload.is_classic(p) == ("/" in tp) for p, tp in bccload.PROGRAMS.items())
    # what the CO-RE object has and bcc cannot build is reported as such, from the same rows
    report = loader.AttachReport(kernel="k")
    report.bcc(bccload.BccPrograms())
    assert set(report.disabled) == {h.program for h in HOOKS if not h.bcc}


def test_the_placeholders_are_the_bcc_sources_maps_numbered_once() -> None:
    """Every map the bcc source names by CP_FD_<name> has a placeholder in the table and no other map has one; the
    numbers are 0..n-1 (a cached compile carries them: bccload.cflags and patch read the same order)."""
    named = set(re.findall(r"CP_FD_(\w+)", BCC_SOURCE.read_text()))
    assert set(PLACED) == named
    numbers = sorted(m.placeholder for m in MAP_TABLE if m.placeholder is not None)
    assert numbers == list(range(len(PLACED)))
    flags = [f for f in bccload.cflags(Path()) if f.startswith("-DCP_FD_")]
    assert flags == [f"-DCP_FD_{m.name}={bccload.PLACEHOLDER + m.placeholder}"
                     for m in sorted(MAP_TABLE, key=lambda m: m.placeholder if m.placeholder is not None else -1)
                     if m.placeholder is not None]


def test_a_bcc_only_map_takes_a_bound_maps_definition() -> None:
    """The bcc build creates the bound maps from the CO-RE object's definitions; a map of its own is a twin of one
    of them (or cp_ksyms, made from KSYMS)."""
    own = [m for m in MAP_TABLE if not m.bound]
    assert {m.name for m in own} == {"cp_ksyms", *bccload.TWINS}
    assert all(of in MAPS for of in bccload.TWINS.values())


def test_the_loaders_views_come_from_the_table() -> None:
    assert hooks.MODULE_HOOKS == {hooks.BCACHE_ALLOC_FAIL: "bcache"}
    assert hooks.KFUNCS == {hooks.BIO_FAST: "bpf_rdonly_cast"}
    assert [h.program for h in HOOKS if h.required] == [hooks.BIO_FAST, hooks.BIO_COMPAT]
    assert set(hooks.DIO_IOMAP) | set(hooks.DIO_SYSCALLS) == {h.program for h in HOOKS if "direct I/O" in h.feature}
    assert set(hooks.FSYNC_SYSCALLS) < {h.program for h in HOOKS if h.feature.startswith("durability calls")}
