"""Inventories from the text of a snapshot, its format told by its content.

Formats: `kubectl get nodes -o json` (a List/NodeList) or one Node; `crictl images -o json`;
`docker images --format '{{json .}}'` lines; a plain list of references (one node); the node
agent's NodeImages objects, alone or in a List. A List may hold RuntimeClasses too
(`kubectl get nodes,runtimeclasses -o json`, `image-preflight inventory dump`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES, Inventory, NodeImages
from image_preflight.core.decide.references import InvalidReference, docker_ref
from image_preflight.core.decide.runtime_classes import KIND as RUNTIME_CLASS_KIND
from image_preflight.core.decide.runtime_classes import runtime_class_from_object
from image_preflight.core.decide.scheduling import SchedulingSpecError
from image_preflight.core.sources.node_status import node_images_from_node
from image_preflight.core.sources.runtime_lists import (
    RUNTIME_KIND,
    image_id,
    image_names,
    node_images_from_runtime,
    renewal,
    renewed,
    string,
)
from image_preflight.errors import InputError

# What an item without a kind is: the apiserver leaves kind out of list items.
_ITEM_KINDS = {"NodeList": "Node", "NodeImagesList": RUNTIME_KIND, "RuntimeClassList": RUNTIME_CLASS_KIND}


_MESSAGE_MAX = 1000  # characters; a message quoting a megabyte string must still be a line to read


class SnapshotError(InputError):
    """The snapshot cannot be read; the message names the source and the line or field.

    Always one printable line of bounded length, whatever the file held (newlines, lone
    surrogates and megabyte strings reach messages through names, keys and paths)."""

    def __init__(self, message: str) -> None:
        if not message.isprintable():
            message = repr(message)[1:-1]
        if len(message) > _MESSAGE_MAX:
            message = f"{message[:_MESSAGE_MAX - 200]} ... {message[-150:]}"
        super().__init__(message)


def load_snapshot(
    text: str,
    *,
    source: str,
    observed_at: float | None = None,
    max_images: int | None = DEFAULT_MAX_IMAGES,
    node_name: str = "node",
) -> Inventory:
    """Read a snapshot. `node_name` names the node of single-node formats (crictl, docker, text)."""
    stripped = text.strip()
    if not stripped:
        raise SnapshotError(f"{source}: empty snapshot")
    try:
        document = _json(stripped, source)
    except json.JSONDecodeError:
        document = None
    # A one-image `docker images` listing is a single JSON object too.
    if isinstance(document, Mapping) and "Repository" not in document:
        return _from_document(document, source, observed_at, max_images, node_name)
    if document is not None and not isinstance(document, Mapping):
        raise SnapshotError(f"{source}: a JSON {type(document).__name__} is not a snapshot of a known shape")
    if stripped.startswith("{"):
        return _from_docker_lines(stripped, source, observed_at, node_name)
    return _from_reference_lines(stripped, source, observed_at, node_name)


def load_document(
    document: Mapping[str, Any], *, source: str, observed_at: float | None = None,
    max_images: int | None = DEFAULT_MAX_IMAGES,
) -> Inventory:
    """Read a snapshot already parsed from JSON (a List as `inventory dump` builds it)."""
    return _from_document(document, source, observed_at, max_images, "node")


class _Constant(ValueError):
    """NaN or ±Infinity: Python's json reads them, Go's (so kubectl's) refuses them."""


def _refuse_constant(token: str) -> float:
    raise _Constant(token)


# An escape of a surrogate (\ud800 to \udfff): lone, it decodes to a string that is not Unicode.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _json(text: str, where: str, *, whole: bool = True) -> object:
    """The JSON value of `text`; raises JSONDecodeError when it is not JSON at all, SnapshotError
    naming `where` (and the line, for a `whole` file) for JSON that Kubernetes never writes."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError:
        raise
    except _Constant as exc:
        line, _ = _first(text, re.escape(str(exc)))
        problem = f"{exc} is not a JSON number"
    except ValueError:  # int()'s digit limit, which json.loads raises bare, without a position
        line, found = _first(text, rf"-?[0-9]{{{sys.get_int_max_str_digits() + 1},}}")
        problem = f"an integer of {len(found.lstrip('-'))} digits" if found else "an integer too long"
    except RecursionError:
        raise SnapshotError(f"{where}: JSON nested too deeply") from None
    else:
        if _SURROGATE_ESCAPE.search(text):
            path = _lone_surrogate(value)
            if path is not None:
                raise SnapshotError(f"{where}: {path or 'the document'}: not valid Unicode (a lone surrogate escape)")
        return value
    at = f":{line}" if whole and line else ""
    raise SnapshotError(f"{where}{at}: not JSON as Kubernetes writes it ({problem})")


def _first(text: str, token: str) -> tuple[int | None, str]:
    """The line and text of the first match of the pattern `token` outside a JSON string."""
    pattern = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w.+-])(' + token + r")(?![\w.])")
    for match in pattern.finditer(text):
        if match.group(1):
            return text.count("\n", 0, match.start()) + 1, match.group(1)
    return None, ""


def _lone_surrogate(document: object) -> str | None:
    """The path of the first key or string holding a lone surrogate, else None. Iterative: the
    document may nest as deep as the parser allowed."""
    stack: list[tuple[str, object]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not _encodable(value):
                return path
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                field = f"{path}.{key}" if path else key
                if not _encodable(key):
                    return field
                stack.append((field, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{index}]", item) for index, item in reversed(list(enumerate(value))))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(value: object) -> str:
    """A value in a message: a short string as written, anything else by its type."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 64 else f"a string of {len(value)} characters"
    return "None" if value is None else f"a {type(value).__name__}"


def _from_document(doc: Mapping[str, Any], source: str, observed_at: float | None, max_images: int | None,
                   node_name: str) -> Inventory:
    kind = doc.get("kind")
    if kind in ("List", *_ITEM_KINDS):
        items = doc.get("items")
        if not isinstance(items, list):
            raise SnapshotError(f"{source}: items: not a list")
        return _from_items(items, source, observed_at, max_images, _ITEM_KINDS.get(kind))
    if kind in ("Node", RUNTIME_KIND, RUNTIME_CLASS_KIND):
        return _from_items([doc], source, observed_at, max_images, None, single=True)
    if isinstance(doc.get("images"), list):
        return Inventory((_from_crictl(doc["images"], source, observed_at, node_name),))
    raise SnapshotError(
        f"{source}: not a snapshot of a known shape (expected a Node, a NodeList, "
        "NodeImages, `crictl images -o json`, `docker images --format '{{json .}}'` or references)"
    )


def _from_items(items: list[Any], source: str, observed_at: float | None, max_images: int | None,
                default_kind: str | None, *, single: bool = False) -> Inventory:
    nodes, runtime, classes, renewals = [], [], {}, {}
    for index, item in enumerate(items):
        where = source if single else f"{source}: items[{index}]"
        kind = (item.get("kind") or default_kind) if isinstance(item, Mapping) else None
        if kind == "Node":
            nodes.append(_node(item, where, observed_at, max_images))
        elif kind == RUNTIME_KIND:
            runtime.append(_runtime(item, where))
        elif kind == RUNTIME_CLASS_KIND:
            try:
                name, scheduling = runtime_class_from_object(item, where)
            except SchedulingSpecError as exc:
                raise SnapshotError(str(exc)) from None
            classes[name] = scheduling
        elif kind == "Lease":  # one that renews a hashed list (inventory dump writes it after the list)
            found = renewal(item)
            if found is None:
                raise SnapshotError(f"{where}: a Lease that renews no node's list (named after the node, "
                                    "held by it, with a renewTime)")
            renewals[found[0]] = found[1]
        else:
            raise SnapshotError(f"{where}: kind {_shown(kind)} is not Node, {RUNTIME_KIND}, {RUNTIME_CLASS_KIND} "
                                "or Lease")
    # The runtime's complete list wins over node status for the same node.
    return Inventory(tuple(nodes), classes).merged(renewed(listed, renewals.get(listed.node)) for listed in runtime)


def _node(item: Mapping[str, Any], where: str, observed_at: float | None, max_images: int | None) -> NodeImages:
    try:
        return node_images_from_node(item, observed_at=observed_at, max_images=max_images)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None


def _runtime(item: Mapping[str, Any], where: str) -> NodeImages:
    try:
        return node_images_from_runtime(item)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None


def _from_crictl(images: list[Any], source: str, observed_at: float | None, node_name: str) -> NodeImages:
    names, ids = [], []
    for index, image in enumerate(images):
        where = f"images[{index}]"
        if not isinstance(image, Mapping):
            raise SnapshotError(f"{source}: {where}: not an object")
        try:
            names += image_names(image, where)
            found = image_id(image, where)
        except ValueError as exc:
            raise SnapshotError(f"{source}: {exc}") from None
        if found:
            ids.append(found)
    return NodeImages.from_names(_single_node(node_name, source), names, ids=ids, observed_at=observed_at,
                                 source="crictl")


def _single_node(node_name: str, source: str) -> str:
    """The node a single-node format speaks for, named after the file."""
    try:
        return string(node_name, "node name (from the file's name)")
    except ValueError as exc:
        raise SnapshotError(f"{source}: {exc}") from None


def _from_docker_lines(text: str, source: str, observed_at: float | None, node_name: str) -> Inventory:
    names = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            row = _json(line, where, whole=False)
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, Mapping) or "Repository" not in row:
            raise SnapshotError(f"{where}: not a `docker images --format '{{{{json .}}}}'` line")
        try:
            repository, tag, digest = (_optional_string(row, field) for field in ("Repository", "Tag", "Digest"))
        except ValueError as exc:
            raise SnapshotError(f"{where}: {exc}") from None
        if repository and repository != "<none>":
            if tag and tag != "<none>":
                names.append(f"{repository}:{tag}")
            if digest and digest != "<none>":
                names.append(f"{repository}@{digest}")
    return Inventory((NodeImages.from_names(_single_node(node_name, source), names, observed_at=observed_at,
                                            source="docker"),))


def _optional_string(row: Mapping[str, Any], field: str) -> str | None:
    value = row.get(field)
    return None if value is None else string(value, field)


def _from_reference_lines(text: str, source: str, observed_at: float | None, node_name: str) -> Inventory:
    names = []
    for number, line in enumerate(text.splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            docker_ref(name)
        except InvalidReference as exc:
            raise SnapshotError(f"{source}:{number}: {exc}") from None
        names.append(name)
    return Inventory((NodeImages.from_names(_single_node(node_name, source), names, observed_at=observed_at,
                                            source="text"),))
