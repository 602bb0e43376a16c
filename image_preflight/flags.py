"""Each flag defined once, on the field of its command's frozen config: name, default, help,
metavar, choices and check. `add_flags` builds the parser from the fields, `Flags.from_args` the
config from what it parsed, and `Flags.__post_init__` checks every value however the config was built.

A Kind gives one metavar, parser and check to one kind of value in every command (FILE, SECONDS,
N, PORT, ...); every kind of number is bounded above as well as below, so that no value reaches a
clock, a timer or a date it overflows. A field's own `check` narrows its kind's, never widens it.
The help of every flag that takes a value ends with its default, derived from the field's default
(or from `unset` where no value has a meaning of its own).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from image_preflight.errors import UsageError


@dataclass(frozen=True)
class Kind:
    metavar: str
    parse: Callable[[str], Any] = str
    problem: Callable[[Any], str | None] = lambda value: None  # why a value is refused, if it is
    show: Callable[[Any], str] = str  # a default as the help prints it


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


_seconds.__name__ = "seconds"  # argparse names a value it cannot parse by its parser's name


def at_least(low: float) -> Callable[[Any], str | None]:
    return lambda value: None if value >= low else f"must be {low:g} or more"


def above(low: float) -> Callable[[Any], str | None]:
    return lambda value: None if value > low else f"must be above {low:g}"


def at_most(high: float, unit: str = "") -> Callable[[Any], str | None]:
    """`unit` follows the number in the message, such as " (a year)"."""
    return lambda value: None if value <= high else f"must be {_number(high)}{unit} or less"


def between(low: float, high: float, unit: str = "") -> Callable[[Any], str | None]:
    """at_least(low) and at_most(high), said as each says it."""
    below, over = at_least(low), at_most(high, unit)
    return lambda value: below(value) or over(value)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def label_map(text: str) -> dict[str, str]:
    """KEY=VALUE[,KEY=VALUE...], a selector of equalities only, such as a nodeSelector is."""
    labels = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE[,KEY=VALUE...]")
        labels[key.strip()] = value.strip()
    return labels


# The longest period a flag may give: every one is waited for or added to a clock by a running
# process, and far longer ones overflow the deadline time.sleep and threading's waits compute
# (time_t), or datetime's year 9999.
MAX_SECONDS = 365 * 24 * 3600
# The largest count: a Kubernetes API int32 (the kubelet's nodeStatusMaxImages is one).
MAX_COUNT = 2**31 - 1

FILE = Kind("FILE", Path)
DIR = Kind("DIR", Path)
SECONDS = Kind("SECONDS", _seconds, between(0, MAX_SECONDS, " (a year)"), lambda value: f"{value:g}")
COUNT = Kind("N", int, between(0, MAX_COUNT))
PORT = Kind("PORT", int, lambda value: None if 0 <= value <= 65535 else "must be 0 to 65535")
NAME = Kind("NAME")
IMAGE = Kind("IMAGE")  # an image reference
ADDRESS = Kind("ADDRESS")  # an address to listen on
SELECTOR = Kind("SELECTOR")  # a label selector, as kubectl's --selector
LABELS = Kind(SELECTOR.metavar, label_map)  # a selector read as the map a nodeSelector is


@dataclass(frozen=True)
class Flag:
    help: str
    kind: Kind | None = None  # None: a switch, or one of `choices`
    name: str = ""  # default: the field's name with dashes
    choices: tuple = ()
    check: Callable[[Any], str | None] | None = None  # besides the kind's, and said first
    unset: str = ""  # what no value means, where the default is None (or empty)
    env: str = ""  # read when the flag is not given
    repeat: bool = False  # repeatable; `collect` turns the values into the field's
    collect: Callable[[list], Any] = tuple
    one_of: str = ""  # one flag of each such group is required, and only one
    negate: bool = False  # a switch that turns the field off
    positional: bool = False  # one or more values without a flag
    required: bool = False


def flag(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, **spec) -> Any:
    """A config field and its flag (Flag's fields as keywords)."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"flag": Flag(**spec)})


def flags_of(group: type, *, when: str = "") -> Any:
    """A field holding another config's flags (such as ClusterFlags), `when` prefixed to their help."""
    return dataclasses.field(default=group(), metadata={"group": group, "when": when})


def _name(field: dataclasses.Field, spec: Flag) -> str:
    return spec.name or "--" + field.name.replace("_", "-")


def _shown(value: Any, spec: Flag) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (tuple, list, frozenset, set)):
        return ", ".join(sorted(str(item) for item in value))
    return spec.kind.show(value) if spec.kind is not None else str(value)


def _default_text(field: dataclasses.Field, spec: Flag) -> str:
    if spec.required or spec.positional or spec.one_of or (spec.kind is None and not spec.choices):
        return ""
    default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    empty = default is None or default == "" or (isinstance(default, (tuple, dict, frozenset)) and not default)
    if spec.env:
        otherwise = spec.unset if empty else _shown(default, spec)
        return f"${spec.env}" + (f", else {otherwise}" if otherwise else "")
    if empty:
        if not spec.unset:
            raise TypeError(f"{_name(field, spec)}: a flag without a default says what no value means (unset=)")
        return spec.unset
    return _shown(default, spec)


def help_text(field: dataclasses.Field, spec: Flag, when: str = "") -> str:
    default = _default_text(field, spec)
    # argparse expands %-formats in help: a literal % is written twice.
    return (when + spec.help + (f" (default: {default})" if default else "")).replace("%", "%%")


def add_flags(parser: argparse.ArgumentParser, config: type, *, when: str = "") -> None:
    """The config's flags on `parser`, in the order of its fields."""
    groups: dict[str, Any] = {}  # one_of: its mutually exclusive group
    for field in dataclasses.fields(config):
        if "group" in field.metadata:
            add_flags(parser, field.metadata["group"], when=when + field.metadata["when"])
            continue
        spec: Flag | None = field.metadata.get("flag")
        if spec is None:
            continue
        target: Any = parser
        if spec.one_of:
            target = groups.get(spec.one_of) or groups.setdefault(
                spec.one_of, parser.add_mutually_exclusive_group(required=True))
        options: dict[str, Any] = {"help": help_text(field, spec, when)}
        if spec.positional:
            if spec.kind is None:
                raise TypeError(f"{field.name}: a positional flag reads its values as a kind (kind=)")
            target.add_argument(field.name, nargs="+", type=spec.kind.parse, metavar=spec.kind.metavar, **options)
            continue
        options.update(dest=field.name, default=None)
        if spec.kind is None and not spec.choices:
            options["action"] = "store_false" if spec.negate else "store_true"
        else:
            if spec.choices:
                options["choices"] = spec.choices
            elif spec.kind is not None:  # as it is without choices: else a switch, above
                options.update(type=spec.kind.parse, metavar=spec.kind.metavar)
            if spec.repeat:
                options["action"] = "append"
            if spec.required:
                options["required"] = True
        target.add_argument(_name(field, spec), **options)


class Flags:
    """Base of a command's config: checks every flag's value, then `check`, the rules between flags."""

    # Each config is a dataclass: what dataclasses.fields() reads of it.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            spec: Flag | None = field.metadata.get("flag")
            value = getattr(self, field.name)
            if spec is None or value is None or spec.repeat or spec.positional:
                continue
            for problem in (spec.check, spec.kind.problem if spec.kind is not None else None):
                said = problem(value) if problem is not None else None
                if said:
                    raise UsageError(f"{_name(field, spec)} {_shown(value, spec)}: {said}")
        self.check()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Any:
        """The config from what add_flags' parser parsed: a flag not given keeps the field's default."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if "group" in field.metadata:
                values[field.name] = field.metadata["group"].from_args(args)
                continue
            spec: Flag | None = field.metadata.get("flag")
            if spec is None:
                continue
            value = getattr(args, field.name, None)
            if value is None and spec.env:
                value = os.environ.get(spec.env) or None
            if value is None:
                continue
            if spec.choices:
                value = next(choice for choice in spec.choices if choice == value)  # the member, for an enum
            if spec.repeat or spec.positional:
                value = spec.collect(value)
            values[field.name] = value
        return cls(**values)

    def check(self) -> None:
        """Rules between flags: raise UsageError naming them."""

