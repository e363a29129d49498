"""Issue 36: a dead dm-cache cache device noticed in bounded time. dm-cache shows a failure only once its metadata is
committed (Capabilities.failure_seen_at_commit), it commits on its own only when the metadata changed, and the
daemon's status reads do not commit (DM_NOFLUSH): the backend reads status with a commit on its first sample and
every FAILURE_COMMIT_S after, and no other kind's does."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path

import pytest

from cachepilot.actions import FAILED, Outcome, Promote
from cachepilot.backends import dmioctl, kernelio, open_backend
from cachepilot.backends.host import Host
from cachepilot.backends.kernelio import COMMIT
from cachepilot.backends.operation import FAILURE_COMMIT_S
from cachepilot.capabilities import CAPABILITIES
from cachepilot.errors import DeviceIOError, KernelRejected, classify_errno
from cachepilot.models.volume import VolumeInfo
from tests.unit.daemon_rig import DEV, FakeBackend, FakeFiles, Rig
from tests.unit.test_backends import CACHE_TABLE, FakeDm, dm_tree

S = 1_000_000_000


class DeadCacheDm(FakeDm):
    """dm-cache as 6.1 behaves once its cache device (metadata and data) died: the status reads as before until a
    metadata commit fails, then "Error" (the failed commit's abort) on every read."""

    def __init__(self) -> None:
        super().__init__(CACHE_TABLE, dirty=40)
        self.dead = False
        self.failed = False
        self.commits = 0

    def __call__(self, args: Sequence[str], timeout: float) -> str:
        if args[0] == "status" and len(args) == 3 and args[2] == COMMIT:
            self.commits += 1
            self.failed = self.failed or self.dead
        if args[0] == "status" and self.failed:
            self.calls.append(tuple(args))
            return "0 2097152 cache Error"
        return super().__call__(args, timeout)


@pytest.mark.parametrize("kind", ["dm-cache", "lvmcache"])
def test_a_dead_dm_cache_is_seen_by_the_next_committing_sample_and_no_later(tmp_path: Path, kind: str) -> None:
    dm_tree(tmp_path, "lab-cached" if kind == "dm-cache" else "labvg-cached")
    fake = DeadCacheDm()
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind=kind), host=Host(sysfs=tmp_path, dm=fake))
    t0 = 1000 * S
    assert not b.sample(t0).failed and fake.commits == 1  # the first sample commits: a cache found dead at once
    fake.dead = True  # its cache device dies; reads without a commit show nothing
    times = [t0 + i * S // 2 for i in range(1, 2 * FAILURE_COMMIT_S + 1)]  # a sample every half second
    seen = next(t for t in times if b.sample(t).failed)
    assert seen == t0 + FAILURE_COMMIT_S * S and fake.commits == 2
    assert b.sample(seen + S // 2).failed and fake.commits == 2  # stays failed without another commit


def test_between_commits_the_samples_do_not_commit(tmp_path: Path) -> None:
    """Commits cost a metadata write each: one per FAILURE_COMMIT_S, not one per tick."""
    dm_tree(tmp_path)
    fake = DeadCacheDm()
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind="dm-cache"), host=Host(sysfs=tmp_path, dm=fake))
    for i in range(6 * FAILURE_COMMIT_S):  # a minute of one-second ticks
        b.sample(i * S)
    assert fake.commits == 6
    status = [c for c in fake.calls if c[0] == "status"]
    assert len(status) == 6 * FAILURE_COMMIT_S and sum(c == ("status", "lab-cached", COMMIT) for c in status) == 6


def test_only_the_kinds_that_need_it_commit() -> None:
    assert {k for k, c in CAPABILITIES.items() if c.failure_seen_at_commit} == {"dm-cache", "lvmcache"}


def test_the_committing_read_is_the_ioctl_without_noflush(monkeypatch: pytest.MonkeyPatch) -> None:
    req = dmioctl.request("lab-cached", table=False, size=4096, commit=True)
    assert dmioctl._HEADER.unpack_from(req, 0)[7] == 0  # no DM_NOFLUSH_FLAG: cache_status commits first
    asked: list[tuple[str, bool, bool]] = []

    def read(name: str, *, table: bool, commit: bool = False) -> str:
        asked.append((name, table, commit))
        return "0 8 cache 8 1/2 128 1/2 0 0 0 0 0 0 0 1 writeback 2 migration_threshold 2048 smq 0 rw -"

    monkeypatch.setattr(dmioctl, "read", read)
    kernelio.run_dm(("status", "lab-cached", COMMIT), 10.0)
    kernelio.run_dm(("status", "lab-cached"), 10.0)
    assert asked == [("lab-cached", False, True), ("lab-cached", False, False)]


def test_without_the_control_node_the_committing_read_is_plain_dmsetup_status(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_control(name: str, *, table: bool, commit: bool = False) -> str:
        raise FileNotFoundError(2, "No such file or directory")

    ran: list[Sequence[str]] = []
    monkeypatch.setattr(dmioctl, "read", no_control)
    monkeypatch.setattr(kernelio, "run_dmsetup", lambda args, timeout: ran.append(tuple(args)) or "")
    kernelio.run_dm(("status", "x", COMMIT), 10.0)
    assert ran == [("status", "x")]  # dmsetup commits unless --noflush; --commit is no dmsetup option


def test_an_io_error_on_the_volume_makes_the_next_sample_commit(tmp_path: Path) -> None:
    """A promotion read or FITRIM that met EIO (the daemon's own I/O on the volume): the cache device may be dead,
    so the next sample commits instead of one up to FAILURE_COMMIT_S later."""
    dm_tree(tmp_path)
    fake = DeadCacheDm()
    b = open_backend(VolumeInfo(dev=2, name="dm-2", kind="dm-cache"), host=Host(sysfs=tmp_path, dm=fake))
    b.sample(0)
    fake.dead = True
    assert not b.sample(S).failed
    b.io_failed()
    assert b.sample(2 * S).failed and fake.commits == 2


def test_eio_is_classified_as_a_device_io_error_still_a_rejection() -> None:
    err = classify_errno(errno.EIO, "promote ino 12")
    assert isinstance(err, DeviceIOError) and isinstance(err, KernelRejected) and err.kind == "rejected"
    assert not isinstance(classify_errno(errno.EINVAL, "x"), DeviceIOError)


class EioFiles(FakeFiles):
    def run(self, action: object, dry_run: bool) -> Outcome:
        self.ran.append((action, dry_run))
        return Outcome(action, FAILED, error=classify_errno(errno.EIO, "promote ino 12"))  # type: ignore[arg-type]


class WatchedBackend(FakeBackend):
    def __init__(self, info: VolumeInfo, **kw: object) -> None:
        super().__init__(info)
        self.io_failures = 0

    def io_failed(self) -> None:
        self.io_failures += 1


def test_the_daemon_tells_the_backend_when_its_own_read_on_the_volume_fails_with_eio(tmp_path: Path) -> None:
    backends: dict[str, WatchedBackend] = {}
    r = Rig(tmp_path, files=EioFiles,
            backend_factory=lambda info: backends.setdefault(info.name, WatchedBackend(info)))
    r.d.start()
    r.tick(1)
    r.d.execute(Promote("bcache0", DEV, 12, 1, ((0, 8192),), "test"), r.d.started_ns)
    assert backends["bcache0"].io_failures == 1
    r.d.shutdown()
