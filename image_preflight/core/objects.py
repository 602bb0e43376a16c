"""Reading API objects without trusting their shape: a field of the wrong type reads as absent."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeGuard

# An API object as decoded from JSON or YAML: its fields' values are not trusted to have any type.
Object = Mapping[str, Any]
# A place in a walk down a value: its parent's place, and its key (or index) there.
_Path = tuple["_Path | None", str | int]


def is_mapping(value: object) -> TypeGuard[Object]:
    return type(value) is dict or isinstance(value, Mapping)  # plain dicts skip the ABC check


def as_mapping(value: object) -> Object:
    """`value` if it is an object, else an empty one."""
    return value if is_mapping(value) else {}


def as_text(value: object) -> str:
    return value if isinstance(value, str) else ""


def deeper_than(value: object, limit: int) -> list[str | int] | None:
    """The keys (str) and indexes (int) down to an object or array of `value` more than `limit`
    levels below it, or None when none is. A walk with a stack of its own: Python's would overflow
    where the value is deep enough to matter."""
    stack: list[tuple[object, int, _Path | None]] = [(value, 0, None)]  # (value, depth, path as (parent, key))
    while stack:
        value, depth, path = stack.pop()
        if depth > limit:
            keys: list[str | int] = []
            while path is not None:
                path, key = path
                keys.append(key)
            return keys[::-1]
        items: Iterable[tuple[str | int, object]] = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ())
        for key, item in items:
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1, (path, key)))
    return None


def field_path(keys: Sequence[str | int], shown: int, key_text: Callable[[str], str] = str) -> str:
    """`keys` as request.object.metadata.namespace[0]..., their first `shown` steps."""
    text = "".join(f"[{k}]" if isinstance(k, int) else f".{key_text(k)}" for k in keys[:shown]).lstrip(".")
    return text + ("..." if len(keys) > shown else "")
