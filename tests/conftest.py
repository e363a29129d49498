"""Every level: how `make test` shares the files among its workers (tests/schedule.py: the lab files first, longest
first; with three workers the host-level files on the third, niced), and the daemons a test starts (in process or
as a child) take a host lock of their own (CACHEPILOT_HOST_LOCK, daemon/lock.py), so they never meet a real daemon
on this host, nor each other when tests run in parallel. A test of the host lock itself points it where it needs
to."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from cachepilot.daemon.lock import HOST_LOCK_ENV
from tests.schedule import HOST_WORKER_NICE, LONGEST_FIRST, host_only_worker

# No per-example deadline for the property tests: they check results, not speed, and hypothesis's default 200 ms
# failed one (test_hotness's discard_many) on a host loaded by lab guests. The examples' count stays each test's own.
settings.register_profile("cachepilot", deadline=None)
settings.load_profile("cachepilot")


@pytest.fixture(autouse=True)
def _own_host_lock(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(HOST_LOCK_ENV, str(tmp_path_factory.mktemp("hostlock") / "daemon.lock"))
    yield


def pytest_configure(config: pytest.Config) -> None:
    """The host-only worker (tests/schedule.py) yields to the lab guests: a lab file cannot be split, a host file is
    short, so the lab files are the ones that must not wait."""
    if host_only_worker(os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 0))):
        os.nice(HOST_WORKER_NICE)


@pytest.hookimpl(optionalhook=True)  # without xdist (-p no:xdist) the hook is unknown
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With --dist loadfile: lab files never on the host-only worker (tests/schedule.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.xdist_schedule import LabWorkersFirst  # xdist's own module: only where xdist runs

    return LabWorkersFirst(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))  # stable: the rest keep theirs
