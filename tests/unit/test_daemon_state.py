"""The state directory: the state file (daemon/state.py: atomic, private, bounded, a corrupt or unwritable one) and the
daemon lock (daemon/lock.py; a hostile local user's cases: test_daemon_lock.py)."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from cachepilot.daemon.lock import DaemonLock
from cachepilot.daemon.state import MAX_HOT, StateFile
from cachepilot.errors import FatalError


def test_state_roundtrip_is_atomic_and_private(tmp_path: Path) -> None:
    sf = StateFile(tmp_path)
    assert sf.read() == (None, f"no state file at {tmp_path}/state.json")
    assert sf.write({"volumes": {"v": {"hot": [[1, 2, 3, 4]]}}, "decisions": [], "counters": {"ticks": 5}})
    doc, why = sf.read()
    assert why == "" and doc is not None and doc["counters"] == {"ticks": 5}
    assert doc["volumes"]["v"]["hot"] == [[1, 2, 3, 4]]
    assert stat.S_IMODE(os.stat(sf.path).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "version"])
def test_corrupt_state_starts_fresh_with_the_reason(tmp_path: Path, damage: str) -> None:
    sf = StateFile(tmp_path)
    sf.write({"volumes": {"v": {"hot": [[i, 1, 100 - i, 4096] for i in range(1, 50)]}}, "decisions": []})
    data = sf.path.read_bytes()
    if damage == "truncate":
        sf.path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        i = data.index(b"4096")
        sf.path.write_bytes(data[:i] + b"4097" + data[i + 4:])
    elif damage == "garbage":
        sf.path.write_bytes(os.urandom(300))
    elif damage == "empty":
        sf.path.write_bytes(b"")
    else:
        sf.path.write_text(json.dumps({"crc32": 0, "state": {"version": 99}}))
    doc, why = sf.read()
    assert doc is None and str(sf.path) in why and ("corrupt" in why or "version" in why)


def test_state_is_bounded(tmp_path: Path) -> None:
    sf = StateFile(tmp_path, max_bytes=64 << 10)
    hot = [[i, i, 1_000_000 - i, 4096] for i in range(1, 3 * MAX_HOT)]
    assert sf.write({"volumes": {"a": {"hot": hot}, "b": {"hot": list(hot)}},
                     "decisions": [{"action": "x" * 100}] * 5000})
    assert sf.path.stat().st_size <= 64 << 10
    doc, _ = sf.read()
    assert doc is not None and len(doc["decisions"]) <= 200
    assert doc["volumes"]["a"]["hot"][0] == hot[0]  # the hottest are the ones kept


def test_full_disk_keeps_the_old_state_and_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sf = StateFile(tmp_path)
    assert sf.write({"volumes": {}, "decisions": [], "counters": {"n": 1}})

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    assert not sf.write({"volumes": {}, "decisions": [], "counters": {"n": 2}})
    monkeypatch.undo()
    assert sf.failed_writes == 1 and "No space left" in (sf.last_error or "")
    assert sf.read()[0]["counters"] == {"n": 1}  # type: ignore[index]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_second_daemon_refused_naming_the_first_pid(tmp_path: Path) -> None:
    first = DaemonLock(tmp_path)
    first.acquire()
    with pytest.raises(FatalError, match=rf"another cachepilot daemon is running \(pid {os.getpid()}, lock "):
        DaemonLock(tmp_path).acquire()
    first.release()
    again = DaemonLock(tmp_path)
    again.acquire()  # released: a restart gets it (the kernel drops it with the process, too)
    again.release()
