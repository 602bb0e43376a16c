"""A node's image list as the kubelet reports it in `node.status.images`: capped, so often partial."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES, NAMES_PER_IMAGE, NodeImages
from image_preflight.core.decide.scheduling import NodeTraits
from image_preflight.core.sources.runtime_lists import string, string_list

# The kubelet's nodeStatusMaxImages as `inventory dump` read it from the node's configz; where a
# Node carries it, it is the cap for that node whatever --max-images says.
CAP_ANNOTATION = "image-preflight.io/node-status-max-images"
_CAP = re.compile(r"-?[0-9]{1,11}")  # ASCII digits only: int() refuses "²", which isdigit() accepts


def node_cap(node: Mapping[str, Any], default: int | None) -> int | None:
    """The cap in force for `node`: its annotation, else `default` (None or negative: no cap)."""
    meta = node.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    value = annotations.get(CAP_ANNOTATION) if isinstance(annotations, Mapping) else None
    if isinstance(value, str) and _CAP.fullmatch(value):
        return int(value)
    return default


def node_images_from_node(
    node: Mapping[str, Any], *, observed_at: float | None = None, max_images: int | None = DEFAULT_MAX_IMAGES
) -> NodeImages:
    """`max_images` is the kubelet's nodeStatusMaxImages (None or -1: no cap), unless the Node
    carries its own (CAP_ANNOTATION)."""
    if not isinstance(node, Mapping):
        raise ValueError(f"expected an object, got {type(node).__name__}")
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if name is None or name == "":
        raise ValueError("metadata.name: missing")
    name = string(name, "metadata.name")
    max_images = node_cap(node, max_images)
    status = node.get("status") or {}
    if not isinstance(status, Mapping):
        raise ValueError(f"node {name}: status: not an object")
    images = status.get("images") or []
    if not isinstance(images, list):
        raise ValueError(f"node {name}: status.images: not a list")
    names: list[str] = []
    capped = max_images is not None and max_images >= 0 and len(images) >= max_images
    # The kubelet cuts the list at exactly its cap (pkg/kubelet/nodestatus/setters.go, Images): a
    # longer list proves the cap in force is not the kubelet's, so the list proves nothing either.
    over_cap = max_images if capped and max_images is not None and len(images) > max_images else None
    truncated = capped
    # A kubelet that could not list its images reports none (pkg/kubelet/nodestatus/setters.go,
    # Images): an empty list proves nothing.
    truncated = truncated or not images
    for index, image in enumerate(images):
        if not isinstance(image, Mapping):
            raise ValueError(f"node {name}: status.images[{index}]: not an object")
        image_names = string_list(image.get("names"), f"node {name}: status.images[{index}]", "names")
        # Five names may mean more were cut: any other name could belong to this image.
        truncated = truncated or len(image_names) >= NAMES_PER_IMAGE
        names += image_names
    return NodeImages.from_names(
        name,
        names,
        traits=NodeTraits.from_node(node),
        complete=not truncated,
        observed_at=observed_at,
        source="node-status",
        capped=capped,
        over_cap=over_cap,
    )
