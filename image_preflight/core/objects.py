"""Reading API objects without trusting their shape: a field of the wrong type reads as absent."""

from __future__ import annotations

from collections.abc import Mapping


def is_mapping(value: object) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # plain dicts skip the ABC check


def as_mapping(value: object) -> Mapping:
    """`value` if it is an object, else an empty one."""
    return value if is_mapping(value) else {}  # type: ignore[return-value]


def as_text(value: object) -> str:
    return value if isinstance(value, str) else ""
