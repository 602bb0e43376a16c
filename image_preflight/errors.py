"""Errors a user sees as one line: the class says what happened, the message names where.

    PreflightError                 every error image-preflight raises on purpose
    ├── InputError (ValueError)    input that cannot be used: a file, a row, a field, an object
    │   └── UsageError             the command line: a flag's value, or flags that cannot go together
    ├── UnavailableError           something the command needs cannot be reached or used: the
    │                              apiserver's objects, the runtime's socket, a port to listen on
    └── BrokenLoopError            a long-running face's loop (the agent's, the watchdog's) ended
                                   on an exception it did not handle

The library raises InputError's kin for bad input (each module's own class, derived from it); the
CLI shows any of them as one line and exits 2, whichever face raised it.
"""


class PreflightError(Exception):
    """The base of every error image-preflight raises on purpose."""


class InputError(PreflightError, ValueError):
    """Input that cannot be used; the message names the file, row or field."""


class UsageError(InputError):
    """Bad usage of a command; the message names the flag or the file it was given."""


class UnavailableError(PreflightError):
    """What the command needs cannot be reached or used; the message names it and why."""


class BrokenLoopError(PreflightError):
    """A long-running face's loop ended on an exception it did not handle (its traceback is
    logged); the message names the loop and the exception."""
