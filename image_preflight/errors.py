"""Errors a user sees as one line.

Every error the project raises on purpose derives from PreflightError. InputError and its kin
(also ValueError subclasses) are what the library raises for bad input; UsageError is the
commands' own, raised only by a command's flag handling. The CLI shows either as one line and
exits 2.
"""


class PreflightError(Exception):
    """The base of every error image-preflight raises on purpose."""


class InputError(PreflightError, ValueError):
    """Input that cannot be used; the message names the file, row or field."""


class UsageError(PreflightError):
    """Bad usage of a command; the message names the flag or the file it was given."""
