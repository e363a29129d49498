"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.daemon_rig import Rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    """A daemon on fakes (tests/unit/daemon_rig.py), shut down after the test."""
    r = Rig(tmp_path)
    yield r
    r.d.shutdown()
