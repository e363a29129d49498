"""Fixtures shared by the unit tests. The promoter's reads are counted exactly, so a reader thread's shedding of
bcache's inherited run history (actuators/taskruns.py: SHED_READS reads of one block before its first read) is off
unless a test turns it on (tests/unit/test_taskruns.py); each test starts with no thread marked as having shed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachepilot.actuators import taskruns
from tests.unit.daemon_rig import Rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A daemon on fakes (tests/unit/daemon_rig.py), shut down after the test."""
    r = Rig(tmp_path)
    yield r
    r.d.shutdown()


@pytest.fixture(autouse=True)
def _no_run_shedding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(taskruns, "SHED_READS", 0)
    monkeypatch.setattr(taskruns, "_done", threading.local())
