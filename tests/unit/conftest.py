"""Unit level: the promoter's reads are counted exactly, so a reader thread's shedding of bcache's inherited run
history (actuators/taskruns.py: SHED_READS reads of one block before its first read) is off unless a test turns it
on (tests/unit/test_taskruns.py); each test starts with no thread marked as having shed."""

from __future__ import annotations

import threading

import pytest

from cachepilot.actuators import taskruns


@pytest.fixture(autouse=True)
def _no_run_shedding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(taskruns, "SHED_READS", 0)
    monkeypatch.setattr(taskruns, "_done", threading.local())
