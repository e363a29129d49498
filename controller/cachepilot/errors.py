"""Errors by class, under one base, so every caller can decide by class what to do:

- :class:`UserError` (alias :class:`ConfigError`): bad input the operator gave (config, policy, trace file,
  device name, CLI argument). The CLI prints one line and exits 2; the daemon logs it and keeps its last good state.
- :class:`KernelError`: what the kernel or a device answered when cachepilot read or wrote it — not the operator's
  input, so never caught as a :class:`UserError`. One of:

  - :class:`KernelRejected`: the kernel refused a write (sysfs EINVAL, a dm message or reload rejected). A config
    problem for that volume: logged, counted, not retried until the input changes.
  - :class:`DeviceGone`: the volume or one of its devices vanished. The daemon drops or marks the volume.
  - :class:`RetryLater`: busy (EBUSY, EAGAIN, a dmsetup time-out): retried with backoff, counted.
  - :class:`DeviceIOError`: an I/O error (EIO), a :class:`KernelRejected` that may mean a dead cache device.

  :func:`classify_errno` is the one rule from an errno to these classes.
- :class:`FatalError`: the controller cannot run at all (probe unusable at start). The daemon exits with the reason.
"""

from __future__ import annotations

import errno
import os


class CachepilotError(Exception):
    """Base of every error cachepilot raises on purpose. Its text is one line naming the problem."""

    kind = "error"


class UserError(CachepilotError):
    """An error caused by input the operator gave (config, policy, trace file, device name).

    The CLI prints it as one line without a traceback; the daemon logs it and keeps its last good state.
    """

    kind = "config"


ConfigError = UserError


class KernelError(CachepilotError):
    """The kernel's or a device's answer to a read or write of ours, classified by what the caller should do. Only
    its subclasses are raised (so it declares no ``kind`` of its own: each subclass is a failure class)."""


class KernelRejected(KernelError):
    """The kernel refused a control write (EINVAL from sysfs, a rejected dm message or table)."""

    kind = "rejected"


class DeviceIOError(KernelRejected):
    """The device answered with an I/O error (EIO): a rejection like any other to the caller, and a sign that a
    cache device may have died (the daemon has the volume's status read with a metadata commit at once where the
    kind shows a dead cache device only then: Capabilities.failure_seen_at_commit)."""


class DeviceGone(KernelError):
    """A volume or one of its devices went away (ENOENT/ENODEV/ENXIO on its sysfs or dm node)."""

    kind = "gone"


class RetryLater(KernelError):
    """Busy or timed out (EBUSY, EAGAIN, a dmsetup that did not answer): try again after a backoff."""

    kind = "retry"


class FatalError(CachepilotError):
    """The controller cannot run (e.g. the probe cannot attach); the daemon exits with this reason."""

    kind = "fatal"


_GONE = frozenset({errno.ENOENT, errno.ENODEV, errno.ENXIO})
_RETRY = frozenset({errno.EBUSY, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT})


def classify_errno(code: int | None, what: str) -> KernelError:
    """The one rule from an errno of a read or write (sysfs, FITRIM, open_by_handle_at...) to an error class.

    Vanished device → DeviceGone; busy or interrupted → RetryLater; anything else (EINVAL, ERANGE, EOPNOTSUPP,
    EPERM, EACCES, EROFS, and an errno not listed here, e.g. EIO) → KernelRejected. An unknown errno is a refusal
    rather than a reason to retry: nothing says it is transient, and retrying would repeat, up to MAX_RETRIES times
    with a warning each, a write the kernel refused for a reason we cannot name. A rejection is not final either:
    the engine asks again for a switch or knob after its own retry interval and re-queues a failed discard.
    """
    text = f"{what}: {os.strerror(code) if code else 'failed'}"
    if code in _GONE:
        return DeviceGone(text)
    if code in _RETRY:
        return RetryLater(text)
    if code == errno.EIO:
        return DeviceIOError(text)
    return KernelRejected(text)
