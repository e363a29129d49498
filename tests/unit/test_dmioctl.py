"""A dm device's status and table through the DM ioctl (backends/dmioctl.py), without a process per tick.

The answers are laid out as the kernel lays them (drivers/md/dm-ioctl.c, retrieve_status: the header, then from
data_start one dm_target_spec per target with its NUL-terminated parameters, ``next`` counted from data_start)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from cachepilot.backends import dmioctl, kernelio
from cachepilot.backends.host import Host
from cachepilot.errors import DeviceGone, KernelRejected

STATUS = ("8 1234/2048 128 10/100 5 6 7 8 0 0 3 1 writeback 2 migration_threshold 2048 smq 0 rw -")


def answer(req: bytearray, targets: Sequence[tuple[int, int, str, str]], *, full: bool = False) -> bytearray:
    """What the kernel writes back into ``req`` for ``targets`` (start, length, type, params)."""
    hdr = dmioctl._HEADER
    f = list(hdr.unpack_from(req, 0))
    data_start = 312
    out, at = bytearray(), 0
    for start, length, ttype, params in targets:
        spec_at = at
        body = params.encode() + b"\0"
        at += 40 + len(body)
        at = (at + 7) & ~7
        out += struct.pack("=QQiI16s", start, length, 0, at, ttype.encode()) + body
        out += b"\0" * (at - spec_at - 40 - len(body))
    f[3], f[4], f[5] = data_start + len(out), data_start, len(targets)
    if full:
        f[7] |= 1 << 8
    buf = bytearray(len(req))
    hdr.pack_into(buf, 0, *f)
    buf[data_start:data_start + len(out)] = out
    return buf


def test_the_request_names_the_device_and_asks_for_status_without_a_metadata_commit() -> None:
    req = dmioctl.request("lab-cached", table=False, size=4096)
    f = dmioctl._HEADER.unpack_from(req, 0)
    assert f[:5] == (4, 0, 0, 4096, 312)
    assert f[7] == 1 << 11  # DM_NOFLUSH_FLAG: dm-cache would commit its metadata on each status otherwise
    assert f[11].rstrip(b"\0") == b"lab-cached"
    assert dmioctl._HEADER.unpack_from(dmioctl.request("x", table=True, size=4096), 0)[7] == 1 << 4
    assert dmioctl._DM_TABLE_STATUS == 0xC138FD0C  # _IOWR(0xfd, 12, struct dm_ioctl) as the kernel's header says


@pytest.mark.parametrize("name", ["", "a" * 128, "a\0b"])
def test_a_name_the_kernel_cannot_take_is_refused(name: str) -> None:
    with pytest.raises(KernelRejected):
        dmioctl.request(name, table=False, size=4096)


def test_an_answer_reads_as_dmsetup_prints_it() -> None:
    req = dmioctl.request("lab-cached", table=False, size=4096)
    one = answer(req, [(0, 1048576, "cache", STATUS)])
    assert dmioctl.parse(one) == f"0 1048576 cache {STATUS}"
    two = answer(req, [(0, 100, "linear", "8:1 0"), (100, 50, "zero", "")])
    assert dmioctl.parse(two) == "0 100 linear 8:1 0\n100 50 zero"


def test_a_full_buffer_is_asked_again_larger(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    sizes: list[int] = []

    def ioctl(fd: int, op: int, buf: bytearray, mutate: bool) -> int:
        sizes.append(len(buf))
        buf[:] = answer(buf, [(0, 8, "cache", STATUS)], full=len(buf) < 60_000)
        return 0

    monkeypatch.setattr(dmioctl.fcntl, "ioctl", ioctl)
    monkeypatch.setattr(dmioctl.os, "open", lambda *a: 99)
    monkeypatch.setattr(dmioctl.os, "close", lambda fd: None)
    assert dmioctl.read("c", table=False) == f"0 8 cache {STATUS}"
    assert sizes == [16384, 65536]


def test_an_answer_cut_short_is_refused() -> None:
    req = dmioctl.request("c", table=False, size=4096)
    buf = answer(req, [(0, 8, "cache", STATUS)])
    f = list(dmioctl._HEADER.unpack_from(buf, 0))
    f[5] = 3  # claims three targets, carries one
    dmioctl._HEADER.pack_into(buf, 0, *f)
    with pytest.raises(KernelRejected):
        dmioctl.parse(buf)


def test_the_daemon_samples_a_dm_device_without_running_dmsetup(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, bool]] = []

    def read(name: str, *, table: bool) -> str:
        asked.append((name, table))
        return f"0 8 cache {STATUS}"

    def no_process(*a: object, **k: object) -> None:
        raise AssertionError("dmsetup run for a status or table")

    monkeypatch.setattr(dmioctl, "read", read)
    monkeypatch.setattr(kernelio.subprocess, "run", no_process)
    host = Host()
    assert host.dm(("status", "lab-cached"), 10.0).endswith(STATUS)
    assert host.reporting().dm(("table", "lab-cached"), 10.0).startswith("0 8 cache")
    assert asked == [("lab-cached", False), ("lab-cached", True)]


def test_without_the_control_node_dmsetup_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_control(name: str, *, table: bool) -> str:
        raise FileNotFoundError(2, "No such file or directory")

    ran: list[Sequence[str]] = []
    monkeypatch.setattr(dmioctl, "read", no_control)
    monkeypatch.setattr(kernelio, "run_dmsetup", lambda args, timeout: ran.append(args) or "from dmsetup")
    assert kernelio.run_dm(("status", "x"), 10.0) == "from dmsetup"
    assert kernelio.run_dm(("message", "x", "0", "cleaner"), 10.0) == "from dmsetup"
    assert ran == [("status", "x"), ("message", "x", "0", "cleaner")]


def test_the_rescans_listing_of_every_table_runs_no_dmsetup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for dm, name in (("dm-0", "lab-origin"), ("dm-2", "lab-cached"), ("dm-3", "gone-meanwhile")):
        (tmp_path / dm / "dm").mkdir(parents=True)
        (tmp_path / dm / "dm" / "name").write_text(name + "\n")
    (tmp_path / "sda").mkdir()
    tables = {"lab-origin": "0 1024 delay 8:0 0 5", "lab-cached": f"0 8 cache {STATUS}\n8 8 zero"}

    def read(name: str, *, table: bool) -> str:
        assert table
        if name not in tables:
            raise DeviceGone(f"{name}: no such device")
        return tables[name]

    def no_process(*a: object, **k: object) -> None:
        raise AssertionError("dmsetup run for the listing")

    monkeypatch.setattr(kernelio, "SYS_BLOCK", tmp_path)
    monkeypatch.setattr(dmioctl, "read", read)
    monkeypatch.setattr(kernelio.subprocess, "run", no_process)
    host = Host()
    assert host.dm_tables() == {"lab-origin": ("0", "1024", "delay", "8:0", "0", "5"),
                                "lab-cached": ("0", "8", "cache", *STATUS.split())}
