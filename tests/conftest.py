"""Every level: the order the files run in (`make test`: the longest lab files first), and the daemons a test
starts (in process or as a child) take a host lock of their own (CACHEPILOT_HOST_LOCK, daemon/lock.py), so they never
meet a real daemon on this host, nor each other when tests run in parallel. A test of the host lock itself points it
where it needs to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from cachepilot.daemon.lock import HOST_LOCK_ENV

# No per-example deadline for the property tests: they check results, not speed, and hypothesis's default 200 ms
# failed one (test_hotness's discard_many) on a host loaded by lab guests. The examples' count stays each test's own.
settings.register_profile("cachepilot", deadline=None)
settings.load_profile("cachepilot")


@pytest.fixture(autouse=True)
def _own_host_lock(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(HOST_LOCK_ENV, str(tmp_path_factory.mktemp("hostlock") / "daemon.lock"))
    yield


# `make test` runs the levels under pytest-xdist with --dist loadfile --no-loadscope-reorder: each worker takes whole
# files, in collection order, the next one as it runs out. These lab files take the longest (seconds per file; fc5
# under `make test`: fleet 624, bpf 372, pin/handoff 320, crash 716, service 142, promote 128, package 127, discard
# stress 114, daemon 109; since cut, alone: fleet 414, crash 191): they start first, longest first, so neither worker
# is left with one of them at the end while the other idles, and the many short files fill both tails. (xdist's own
# reorder puts files with the most tests first: these, with one to three tests each, came last, after 80 others.)
LONGEST_FIRST = (
    "tests/vm/test_pin_handoff_lab.py",  # 6-7 min alone since host B runs twice (the import with --wait too)
    "tests/vm/test_fleet_lab.py",
    "tests/vm/test_bpf_lab.py",
    "tests/vm/test_bcc_lab.py",  # 221 s alone: one compile, 32 host tests and the stacked one
    "tests/vm/test_daemon_crash_lab.py",
    "tests/vm/test_service_lab.py",
    "tests/vm/test_promote_lab.py",
    "tests/vm/test_package_lab.py",
    "tests/vm/test_discard_stress_lab.py",
    "tests/vm/test_daemon_lab.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))  # stable: the rest keep theirs
