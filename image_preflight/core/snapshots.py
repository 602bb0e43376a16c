"""Inventories from the text of a snapshot, its format told by its content.

Formats: `kubectl get nodes -o json` (a List/NodeList) or one Node; `crictl images -o json`;
`docker images --format '{{json .}}'` lines; a plain list of references (one node); the node
agent's NodeImages objects, alone or in a List. A List may hold RuntimeClasses too
(`kubectl get nodes,runtimeclasses -o json`, `image-preflight inventory dump`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from image_preflight.core.images import InvalidReference, docker_ref
from image_preflight.core.inventory import DEFAULT_MAX_IMAGES, Inventory, NodeImages
from image_preflight.core.node_status import node_images_from_node
from image_preflight.core.runtime_classes import KIND as RUNTIME_CLASS_KIND
from image_preflight.core.runtime_classes import runtime_class_from_object
from image_preflight.core.runtime_inventory import RUNTIME_KIND, image_names, node_images_from_runtime
from image_preflight.core.scheduling import SchedulingSpecError

# What an item without a kind is: the apiserver leaves kind out of list items.
_ITEM_KINDS = {"NodeList": "Node", "NodeImagesList": RUNTIME_KIND, "RuntimeClassList": RUNTIME_CLASS_KIND}


class SnapshotError(ValueError):
    """The snapshot cannot be read; the message names the source and the line or field."""


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
        document = json.loads(stripped)
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
    document: Mapping, *, source: str, observed_at: float | None = None, max_images: int | None = DEFAULT_MAX_IMAGES
) -> Inventory:
    """Read a snapshot already parsed from JSON (a List as `inventory dump` builds it)."""
    return _from_document(document, source, observed_at, max_images, "node")


def _from_document(doc: Mapping, source: str, observed_at, max_images, node_name) -> Inventory:
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


def _from_items(items: list, source: str, observed_at, max_images, default_kind: str | None, *,
                single: bool = False) -> Inventory:
    nodes, runtime, classes = [], [], {}
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
        else:
            raise SnapshotError(f"{where}: kind {kind!r} is not Node, {RUNTIME_KIND} or {RUNTIME_CLASS_KIND}")
    # The runtime's complete list wins over node status for the same node.
    return Inventory(tuple(nodes), classes).merged(runtime)


def _node(item: Mapping, where: str, observed_at, max_images) -> NodeImages:
    try:
        return node_images_from_node(item, observed_at=observed_at, max_images=max_images)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None


def _runtime(item: Mapping, where: str) -> NodeImages:
    try:
        return node_images_from_runtime(item)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None


def _from_crictl(images: list, source: str, observed_at, node_name: str) -> NodeImages:
    names, ids = [], []
    for index, image in enumerate(images):
        if not isinstance(image, Mapping):
            raise SnapshotError(f"{source}: images[{index}]: not an object")
        try:
            names += image_names(image, f"images[{index}]")
        except ValueError as exc:
            raise SnapshotError(f"{source}: {exc}") from None
        if image.get("id"):
            ids.append(image["id"])
    return NodeImages.from_names(node_name, names, ids=ids, observed_at=observed_at, source="crictl")


def _from_docker_lines(text: str, source: str, observed_at, node_name: str) -> Inventory:
    names = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"{source}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, Mapping) or "Repository" not in row:
            raise SnapshotError(f"{source}:{number}: not a `docker images --format '{{{{json .}}}}'` line")
        repository, tag, digest = row.get("Repository"), row.get("Tag"), row.get("Digest")
        if repository and repository != "<none>":
            if tag and tag != "<none>":
                names.append(f"{repository}:{tag}")
            if digest and digest != "<none>":
                names.append(f"{repository}@{digest}")
    return Inventory((NodeImages.from_names(node_name, names, observed_at=observed_at, source="docker"),))


def _from_reference_lines(text: str, source: str, observed_at, node_name: str) -> Inventory:
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
    return Inventory((NodeImages.from_names(node_name, names, observed_at=observed_at, source="text"),))
