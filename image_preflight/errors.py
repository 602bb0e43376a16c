"""Errors a user sees as one line.

InputError and its kin (ValueError subclasses) are what the Python API raises for bad input;
UsageError is the command line's own. The CLI shows either as one line and exits 2.
"""


class InputError(ValueError):
    """Input that cannot be used; the message names the file, row or field."""


class UsageError(Exception):
    """Bad usage or unreadable input; the message names the file, row or field."""
