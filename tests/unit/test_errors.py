"""Errors by class: what the kernel answered is never the operator's input, and one errno rule for every caller
(the daemon's side of both: tests/unit/test_daemon.py)."""

from __future__ import annotations

import errno

import pytest

from cachepilot.errors import (
    DeviceGone,
    DeviceIOError,
    KernelError,
    KernelRejected,
    RetryLater,
    UserError,
    classify_errno,
)


@pytest.mark.parametrize("cls", [DeviceGone, KernelRejected, RetryLater])
def test_kernel_answers_are_not_user_errors(cls: type[KernelError]) -> None:
    assert issubclass(cls, KernelError)
    with pytest.raises(cls):  # an `except UserError` meant for bad input lets a vanished device through
        try:
            raise cls("x")
        except UserError:
            pytest.fail(f"{cls.__name__} caught as a UserError")


@pytest.mark.parametrize(("code", "cls"), [
    (errno.ENOENT, DeviceGone), (errno.ENODEV, DeviceGone), (errno.ENXIO, DeviceGone),
    (errno.EBUSY, RetryLater), (errno.EAGAIN, RetryLater), (errno.EINTR, RetryLater), (errno.ETIMEDOUT, RetryLater),
    (errno.EINVAL, KernelRejected), (errno.EROFS, KernelRejected),
    (errno.EIO, DeviceIOError),  # a rejection (a subclass) that may mean a dead cache device
    (None, KernelRejected),  # unknown: a refusal, not a reason to retry
])
def test_one_errno_rule(code: int | None, cls: type[KernelError]) -> None:
    exc = classify_errno(code, "write /sys/block/bcache0/bcache/cache_mode")
    assert type(exc) is cls and str(exc).startswith("write /sys/block/bcache0/bcache/cache_mode: ")
