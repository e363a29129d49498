"""The bcc capture path's pieces that need no kernel: placeholder patching, the compile cache's key and its checks,
kallsyms parsing. (The compile, load and exact counts: tests/vm/test_bcc_lab.py.)"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from cachepilot.errors import UserError
from cachepilot.probe import bccload
from cachepilot.probe.bccload import PLACED, PLACEHOLDER, PROGRAMS

BPF = Path(__file__).resolve().parents[2] / "bpf"


def _insn(code: int, dst: int, src: int, off: int, imm: int) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def test_map_placeholders_become_the_maps_fds() -> None:
    watched, events = PLACEHOLDER + PLACED.index("watched"), PLACEHOLDER + PLACED.index("events")
    prog = (_insn(0x18, 1, 1, 0, watched) + _insn(0, 0, 0, 0, 0) + _insn(0xB7, 0, 0, 0, watched)  # a plain constant
            + _insn(0x18, 2, 1, 0, events) + _insn(0, 0, 0, 0, 0) + _insn(0x95, 0, 0, 0, 0))
    out = bccload.patch(prog, {watched: 7, events: 9})
    imms = [struct.unpack("<i", out[i + 4 : i + 8])[0] for i in range(0, len(out), 8)]
    assert imms == [7, 0, watched, 9, 0, 0]  # only the map loads changed


def test_an_unknown_map_reference_is_refused() -> None:
    prog = _insn(0x18, 1, 1, 0, 12345) + _insn(0, 0, 0, 0, 0) + _insn(0x95, 0, 0, 0, 0)
    with pytest.raises(UserError, match="unknown map"):
        bccload.patch(prog, {PLACEHOLDER: 3})


def test_cache_is_keyed_by_release_and_source(tmp_path: Path) -> None:
    src = tmp_path / "bpf"
    shutil.copytree(BPF, src, ignore=shutil.ignore_patterns(".output", "vmlinux.h"))
    first = bccload.cache_file(tmp_path, "6.1.0-56-amd64", src)
    assert bccload.cache_file(tmp_path, "6.1.0-56-amd64", src) == first
    assert bccload.cache_file(tmp_path, "6.1.0-57-amd64", src) != first
    (src / "helpers.bpf.h").write_text((src / "helpers.bpf.h").read_text() + "\n/* changed */\n")
    assert bccload.cache_file(tmp_path, "6.1.0-56-amd64", src) != first


def test_a_cached_compile_is_used_without_bcc(tmp_path: Path) -> None:
    path = bccload.cache_file(tmp_path, "r1")
    path.write_text(json.dumps({name: _insn(0x95, 0, 0, 0, 0).hex() for name in PROGRAMS}))
    code, cached = bccload.compiled(tmp_path, "r1", tmp_path, python=tmp_path / "no-python")
    assert cached and set(code) == set(PROGRAMS)


@pytest.mark.parametrize("content", ["{", "[]", json.dumps({"on_bio_queue_compat": "95"}),
                                     json.dumps(dict.fromkeys(PROGRAMS, "zz"))])
def test_a_bad_cache_is_compiled_again(tmp_path: Path, content: str) -> None:
    """A torn or stale cache file is not loaded: the compile runs again (here it cannot: one line saying so)."""
    bccload.cache_file(tmp_path, "r1").write_text(content)
    with pytest.raises(UserError) as e:
        bccload.compiled(tmp_path, "r1", tmp_path, python=tmp_path / "no-python")
    assert "bcc could not compile" in str(e.value) and "\n" not in str(e.value)


def test_kallsyms_addresses(tmp_path: Path) -> None:
    f = tmp_path / "kallsyms"
    f.write_text("ffffffff81000000 T _stext\nffffffff8150a0b0 t bio_chain_endio\n"
                 "ffffffff81444440 T iomap_dio_bio_end_io\nffffffffc0123000 t ext4_free_blocks\t[ext4]\n")
    assert bccload.kallsyms(bccload.KSYMS, f) == {"bio_chain_endio": 0xFFFFFFFF8150A0B0,
                                                   "iomap_dio_bio_end_io": 0xFFFFFFFF81444440}


def test_the_sources_come_from_the_checkout_else_from_the_package(tmp_path: Path) -> None:
    """An installed package has no checkout: the bcc build's sources travel in the wheel under data/bcc/ (as the
    CO-RE object under data/); a checkout's bpf/ wins when there is one."""
    checkout, packaged = tmp_path / "bpf", tmp_path / "data" / "bcc"
    packaged.mkdir(parents=True)
    (packaged / bccload.SOURCE_NAME).write_text("/* packaged */\n")
    assert bccload.bpf_source_dir(checkout, packaged) == packaged
    checkout.mkdir()
    (checkout / bccload.SOURCE_NAME).write_text("/* checkout */\n")
    assert bccload.bpf_source_dir(checkout, packaged) == checkout
    assert bccload.bpf_source_dir() == bccload.CHECKOUT_BPF_DIR  # this checkout
