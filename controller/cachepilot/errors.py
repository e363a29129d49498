"""Errors by class, under one base, so every caller can decide by class what to do:

- :class:`UserError` (alias :class:`ConfigError`): bad input the operator gave (config, policy, trace file,
  device name, CLI argument). The CLI prints one line and exits 2; the daemon logs it and keeps its last good state.
- :class:`KernelRejected`: the kernel refused a write (sysfs EINVAL, a dm message or reload rejected). A config
  problem for that volume: logged, counted, not retried until the input changes.
- :class:`DeviceGone`: the volume or one of its devices vanished. The daemon drops or marks the volume.
- :class:`RetryLater`: busy (EBUSY, EAGAIN, a dmsetup time-out): retried with backoff, counted.
- :class:`FatalError`: the controller cannot run at all (probe unusable at start). The daemon exits with the reason.
"""

from __future__ import annotations


class CachepilotError(Exception):
    """Base of every error cachepilot raises on purpose. Its text is one line naming the problem."""

    kind = "error"


class UserError(CachepilotError):
    """An error caused by input the operator gave (config, policy, trace file, device name).

    The CLI prints it as one line without a traceback; the daemon logs it and keeps its last good state.
    """

    kind = "config"


ConfigError = UserError


class KernelRejected(UserError):
    """The kernel refused a control write (EINVAL from sysfs, a rejected dm message or table)."""

    kind = "rejected"


class DeviceGone(UserError):
    """A volume or one of its devices went away (ENOENT/ENODEV/ENXIO on its sysfs or dm node)."""

    kind = "gone"


class RetryLater(CachepilotError):
    """Busy or timed out (EBUSY, EAGAIN, a dmsetup that did not answer): try again after a backoff."""

    kind = "retry"


class FatalError(CachepilotError):
    """The controller cannot run (e.g. the probe cannot attach); the daemon exits with this reason."""

    kind = "fatal"
