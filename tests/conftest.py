"""Every level: the daemons a test starts (in process or as a child) take a host lock of their own
(CACHEPILOT_HOST_LOCK, daemon/lock.py), so they never meet a real daemon on this host, nor each other when tests
run in parallel. A test of the host lock itself points it where it needs to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cachepilot.daemon.lock import HOST_LOCK_ENV


@pytest.fixture(autouse=True)
def _own_host_lock(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(HOST_LOCK_ENV, str(tmp_path_factory.mktemp("hostlock") / "daemon.lock"))
    yield
