"""The Status an apiserver error carries (meta/v1 Status: code, reason, message), read one way for
every face and test; and any error a call to the apiserver raised, said in one line for the log."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

from image_preflight.errors import PreflightError


def status_of(exc: ApiException) -> dict:
    """The Status in the error's body; {} when the body is not one."""
    try:
        status = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        return {}
    return status if isinstance(status, dict) else {}


def status_message(exc: ApiException) -> str:
    """The Status' message, or ""."""
    message = status_of(exc).get("message")
    return message if isinstance(message, str) else ""


def describe_error(exc: BaseException) -> str:
    """One line for the log: status and Status message for API errors, the text of an error raised
    on purpose (a PreflightError says what happened itself), else type and text."""
    if isinstance(exc, ApiException):
        message = status_message(exc)
        text = f"HTTP {exc.status} {exc.reason}" + (f": {message}" if message else "")
    elif isinstance(exc, PreflightError):
        text = str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())
