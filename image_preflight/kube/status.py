"""The Status an apiserver error carries (meta/v1 Status: code, reason, message), read one way for
every face and test."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException


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
