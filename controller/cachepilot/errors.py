"""Errors shared across the package."""


class UserError(Exception):
    """An error caused by input the operator gave (config, policy, trace file, device name).

    The CLI prints it as one line without a traceback; the daemon logs it and keeps its last good state.
    """
