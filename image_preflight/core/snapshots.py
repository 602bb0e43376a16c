"""Inventories from the text of a snapshot, its format told by its content.

Formats: `kubectl get nodes -o json` (a List/NodeList) or one Node; `crictl images -o json`;
`docker images --format '{{json .}}'` lines; a plain list of references (one node); the node
agent's NodeImages objects, alone or in a List.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from image_preflight.core.images import InvalidReference, docker_ref
from image_preflight.core.inventory import DEFAULT_MAX_IMAGES, Inventory, NodeImages
from image_preflight.core.node_status import node_images_from_node
from image_preflight.core.runtime_inventory import RUNTIME_KIND, image_names, node_images_from_runtime

# What an item without a kind is: the apiserver leaves kind out of list items.
_ITEM_KINDS = {"NodeList": "Node", "NodeImagesList": RUNTIME_KIND}


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


def _from_document(doc: Mapping, source: str, observed_at, max_images, node_name) -> Inventory:
    kind = doc.get("kind")
    if kind in ("List", "NodeList", "NodeImagesList"):
        items = doc.get("items")
        if not isinstance(items, list):
            raise SnapshotError(f"{source}: items: not a list")
        nodes, runtime = [], []
        for index, item in enumerate(items):
            convert = _item_reader(item, f"{source}: items[{index}]", _ITEM_KINDS.get(kind))
            (runtime if convert is _runtime else nodes).append(
                convert(item, f"{source}: items[{index}]", observed_at, max_images)
            )
        # The runtime's complete list wins over node status for the same node.
        return Inventory(tuple(nodes)).merged(runtime)
    if kind in ("Node", RUNTIME_KIND):
        convert = _item_reader(doc, source)
        return Inventory((convert(doc, source, observed_at, max_images),))
    if isinstance(doc.get("images"), list):
        return Inventory((_from_crictl(doc["images"], source, observed_at, node_name),))
    raise SnapshotError(
        f"{source}: not a snapshot of a known shape (expected a Node, a NodeList, "
        "NodeImages, `crictl images -o json`, `docker images --format '{{json .}}'` or references)"
    )


def _node(item: Mapping, where: str, observed_at, max_images) -> NodeImages:
    try:
        return node_images_from_node(item, observed_at=observed_at, max_images=max_images)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None


def _runtime(item: Mapping, where: str, observed_at, max_images) -> NodeImages:
    try:
        return node_images_from_runtime(item)
    except ValueError as exc:
        raise SnapshotError(f"{where}: {exc}") from None


def _item_reader(item: object, where: str, default_kind: str | None = None) -> Callable[..., NodeImages]:
    kind = (item.get("kind") or default_kind) if isinstance(item, Mapping) else None
    if kind == "Node":
        return _node
    if kind == RUNTIME_KIND:
        return _runtime
    raise SnapshotError(f"{where}: kind {kind!r} is neither Node nor {RUNTIME_KIND}")


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
