"""Errors a user sees as one line and exit status 2."""


class UsageError(Exception):
    """Bad usage or unreadable input; the message names the file, row or field."""
