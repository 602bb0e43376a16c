"""Render a template's shape once, and only its escaped values per row.

Rollout templates print row fields as `{{ expr | yaml_escape }}`: each such *slot* becomes one
JSON-quoted YAML string, whatever the row holds, so it cannot change the document's shape. The
fields read anywhere else *steer* the shape. Rendering the template with a marker in every
slot gives the Job's shape for all rows that agree on the steering fields; a row's verdict then
needs only its slot values in the pod's image and scheduling fields, not a render and a YAML
parse of its own. The markers are checked to stand as whole string values, so substituting a
slot's text gives exactly what the controller's YAML parse would.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import jinja2
from jinja2 import nodes

from image_preflight.core.decide.workloads import deciding_fields

_MARKER = "image-preflight-slot-{}-5d1f"
_SLOT_NAMES = frozenset({"input", "job_name"})
Path = tuple[str | int, ...]  # the keys from the row to one of its fields


@dataclass(frozen=True, slots=True)
class Slot:
    marker: str
    expression: jinja2.Template  # renders str(expr) for a row
    paths: tuple[Path, ...]  # the input fields expr reads
    bare: Path | None  # expr is exactly input.<bare>


@dataclass(frozen=True, slots=True)
class SlotPlan:
    slots: tuple[Slot, ...]
    shape: jinja2.Template  # the template with every slot printing its marker
    steering: tuple[Path, ...]  # fields read outside slots


def plan_slots(env: jinja2.Environment, tree: nodes.Template, chains: Sequence[tuple[Path, nodes.Node, nodes.Name]],
               parents: dict[int, nodes.Node]) -> SlotPlan | None:
    """`chains`: [(path, outermost chain node, Name node)] of every `input` read."""
    found: list[tuple[tuple[int, int], nodes.Expr]] = []  # (output position, expression)
    for out_index, output in enumerate(tree.find_all(nodes.Output)):
        for node_index, child in enumerate(output.nodes):
            expression = _slot_expression(child, env)
            if expression is not None:
                found.append(((out_index, node_index), expression))
    if not found:
        return None
    inside: dict[int, int] = {}  # id(node) -> slot number
    for number, (_, expression) in enumerate(found):
        inside[id(expression)] = number
        for node in expression.find_all(nodes.Node):
            inside[id(node)] = number
    slot_paths: list[set[Path]] = [set() for _ in found]
    bare: list[Path | None] = [None] * len(found)
    steering: set[Path] = set()
    for path, top, name in chains:
        slot = inside.get(id(name))
        if slot is None:
            steering.add(path)
            continue
        slot_paths[slot].add(path)
        if top is found[slot][1]:
            bare[slot] = path
    shape_tree = copy.deepcopy(tree)
    outputs = list(shape_tree.find_all(nodes.Output))
    slots = []
    for number, ((out_index, node_index), expression) in enumerate(found):
        marker = _MARKER.format(number)
        printed = outputs[out_index].nodes[node_index]
        assert isinstance(printed, nodes.Filter)  # the copy of the slot's yaml_escape
        printed.node = nodes.Const(marker)
        template = env.from_string(nodes.Template([nodes.Output([copy.deepcopy(expression)])]))
        slots.append(Slot(marker, template, tuple(sorted(slot_paths[number], key=_order)), bare[number]))
    return SlotPlan(tuple(slots), env.from_string(shape_tree), tuple(sorted(steering, key=_order)))


def _order(path: Path) -> tuple[str, ...]:
    return tuple(map(str, path))


def _slot_expression(child: nodes.Node, env: jinja2.Environment) -> nodes.Expr | None:
    """The expression `child` prints, if `child` is a slot."""
    if not (
        isinstance(child, nodes.Filter)
        and child.name == "yaml_escape"
        and not child.args
        and not child.kwargs
        and child.dyn_args is None
        and child.dyn_kwargs is None
        and child.node is not None
    ):
        return None
    names = list(child.node.find_all(nodes.Name))
    if isinstance(child.node, nodes.Name):
        names.append(child.node)
    # Only the row, the job name and globals: loop or `set` variables exist only in place.
    slot = any(n.name == "input" for n in names) and all(
        n.name in _SLOT_NAMES or n.name in env.globals for n in names
    )
    return child.node if slot else None


@dataclass(frozen=True, slots=True)
class Shape:
    """One rendering of the shape: the pod's decision fields, with markers where slots go."""

    fields: dict[str, Any]  # the pod spec's deciding fields (workloads.deciding_fields)
    deciding: frozenset[str]  # markers inside those fields


def shape_of(text: str, spec: Mapping[str, Any], job: Mapping[str, Any], markers: list[str]) -> Shape | None:
    """None unless every marker in `text` is a whole string value of `job` (never a key, a
    comment, or part of a longer string), so that any slot text substitutes exactly."""
    counts = dict.fromkeys(markers, 0)
    for value, is_key in _strings(job):
        if "image-preflight-slot-" not in value:
            continue
        if is_key or value not in counts:
            return None
        counts[value] += 1
    if any(text.count(marker) != count for marker, count in counts.items()):
        return None
    fields = deciding_fields(spec)
    encoded = json.dumps(fields, default=str)
    return Shape(fields, frozenset(m for m in markers if m in encoded))


@overload
def substitute(node: Mapping[Any, Any], texts: Mapping[str, str]) -> dict[Any, Any]: ...
@overload
def substitute(node: object, texts: Mapping[str, str]) -> object: ...
def substitute(node: object, texts: Mapping[str, str]) -> object:
    if isinstance(node, str):
        return texts.get(node, node)
    if isinstance(node, Mapping):
        return {k: substitute(v, texts) for k, v in node.items()}
    if isinstance(node, list):
        return [substitute(v, texts) for v in node]
    return node


def survives_yaml(text: str) -> bool:
    """Whether json.dumps(text) parses back to `text` in YAML: a character past U+FFFF is
    escaped as a surrogate pair, which YAML reads back as two lone surrogates."""
    return text.isascii() or all(ord(c) <= 0xFFFF for c in text)


def _strings(node: object, is_key: bool = False) -> Iterator[tuple[str, bool]]:
    if isinstance(node, str):
        yield node, is_key
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(key, True)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)
