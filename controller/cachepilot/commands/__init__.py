"""Subcommands of the `cachepilot` CLI: one module each, each with `register(subparsers)`.

A handler is set with `parser.set_defaults(handler=func)`; it returns the exit code.
Raise `cachepilot.errors.UserError` for operator mistakes (printed without a traceback).
"""
