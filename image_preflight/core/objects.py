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


def deeper_than(value: object, limit: int) -> list | None:
    """The keys (str) and indexes (int) down to an object or array of `value` more than `limit`
    levels below it, or None when none is. A walk with a stack of its own: Python's would overflow
    where the value is deep enough to matter."""
    stack: list[tuple[object, int, tuple | None]] = [(value, 0, None)]  # (value, depth, path as (parent, key))
    while stack:
        value, depth, path = stack.pop()
        if depth > limit:
            keys = []
            while path is not None:
                path, key = path
                keys.append(key)
            return keys[::-1]
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1, (path, key)))
    return None


def field_path(keys: list, shown: int, key_text=str) -> str:
    """`keys` as request.object.metadata.namespace[0]..., their first `shown` steps."""
    text = "".join(f"[{k}]" if isinstance(k, int) else f".{key_text(k)}" for k in keys[:shown]).lstrip(".")
    return text + ("..." if len(keys) > shown else "")
