"""The discard actuator with a fake FITRIM: ranges coalesced, one FITRIM each, paced, skipped under -o discard,
never another filesystem, errors classified."""

from __future__ import annotations

import errno
import os

import pytest

from cachepilot.actions import DiscardRanges
from cachepilot.actuators.discard import DONE, FAILED, PENDING, SKIPPED, Discarder
from cachepilot.errors import DeviceGone, KernelRejected, RetryLater
from cachepilot.events import kdev_from_st_dev
from cachepilot.models.volume import VolumeInfo

MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t


@pytest.fixture
def vol(tmp_path):
    dev = kdev_from_st_dev(os.stat(tmp_path).st_dev)
    return VolumeInfo(dev=dev, name="bcache0", mountpoint=str(tmp_path), fs_block_size=4096)


def make(vol, rate=64 * MIB, fail=None):
    calls = []

    def trim(fd, start, length, minlen):
        assert os.path.samestat(os.fstat(fd), os.stat(vol.mountpoint))
        calls.append((start, length, minlen))
        if fail:
            raise OSError(fail, os.strerror(fail))
        return length // 2

    clock = Clock()
    return Discarder(vol, max_rate=rate, trim=trim, clock=clock), calls, clock


def test_each_coalesced_range_is_one_fitrim(vol):
    d, calls, _ = make(vol)
    a = DiscardRanges("bcache0", vol.dev, ((8 * MIB, MIB), (0, 4096), (9 * MIB, MIB), (4096, 4096)), "deletes")
    r = d.run(a)
    assert r.status == DONE
    assert calls == [(0, 8192, 4096), (8 * MIB, 2 * MIB, 4096)]
    assert r.issued_bytes == 2 * MIB + 8192 and r.trimmed_bytes == MIB + 4096
    assert "filesystem trimmed" in r.line()


def test_a_discard_that_ran_logs_no_line_of_its_own(vol, caplog):
    """The daemon's decision record logs each outcome; the actuator's own copy of that line was a second one per
    discard (issue 23 item 5: the daemon's CPU)."""
    import logging

    d, _, _ = make(vol)
    with caplog.at_level(logging.INFO, logger="cachepilot"):
        r = d.run(DiscardRanges("bcache0", vol.dev, ((0, 4096),), "deletes"))
    assert r.status == DONE and caplog.records == []


def test_pacing_defers_the_rest_and_the_rate_refills(vol):
    d, calls, clock = make(vol, rate=MIB)
    a = DiscardRanges("bcache0", vol.dev, ((0, MIB), (4 * MIB, MIB)), "deletes")
    r = d.run(a)
    assert r.status == PENDING and calls == [(0, MIB, 4096)]
    assert r.deferred is not None and r.deferred.ranges == ((4 * MIB, MIB),)
    assert d.run(r.deferred).status == PENDING  # no time passed: no budget
    clock.t = 500_000_000
    r2 = d.run(r.deferred)
    assert r2.status == PENDING and r2.issued == ((4 * MIB, MIB // 2),)
    clock.t = 2_000_000_000
    assert d.run(r2.deferred).status == DONE


def test_skipped_under_mount_option_discard(vol):
    from dataclasses import replace
    d, calls, _ = make(replace(vol, fs_discard=True))
    r = d.run(DiscardRanges("bcache0", vol.dev, ((0, MIB),), "deletes"))
    assert r.status == SKIPPED and calls == [] and "-o discard" in r.detail


def test_never_trims_another_filesystem(vol):
    d, calls, _ = make(vol)
    r = d.run(DiscardRanges("bcache0", vol.dev + 1, ((0, MIB),), "deletes"))
    assert r.status == FAILED and isinstance(r.error, DeviceGone) and calls == []


@pytest.mark.parametrize("code, cls", [(errno.EOPNOTSUPP, KernelRejected), (errno.ENOTTY, KernelRejected),
                                       (errno.EINVAL, KernelRejected),
                                       (errno.EBUSY, RetryLater), (errno.ENODEV, DeviceGone)])
def test_errors_are_classified_and_counted(vol, code, cls):
    d, _, _ = make(vol, fail=code)
    r = d.run(DiscardRanges("bcache0", vol.dev, ((0, MIB),), "deletes"))
    assert r.status == FAILED and isinstance(r.error, cls)
    assert d.errors[cls.kind] == 1


def test_dry_run_trims_nothing(vol):
    d, calls, _ = make(vol)
    r = d.run(DiscardRanges("bcache0", vol.dev, ((0, MIB),), "deletes"), dry_run=True)
    assert r.dry_run and r.issued == ((0, MIB),) and calls == []

