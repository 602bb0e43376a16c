"""A node's image list as the kubelet reports it in `node.status.images`: capped, so often partial."""

from __future__ import annotations

from collections.abc import Mapping

from image_preflight.core.inventory import DEFAULT_MAX_IMAGES, NAMES_PER_IMAGE, NodeImages
from image_preflight.core.scheduling import NodeTraits


def node_images_from_node(
    node: Mapping, *, observed_at: float | None = None, max_images: int | None = DEFAULT_MAX_IMAGES
) -> NodeImages:
    """`max_images` is the kubelet's nodeStatusMaxImages (None or -1: no cap)."""
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name: missing")
    status = node.get("status") or {}
    if not isinstance(status, Mapping):
        raise ValueError(f"node {name}: status: not an object")
    images = status.get("images") or []
    if not isinstance(images, list):
        raise ValueError(f"node {name}: status.images: not a list")
    names: list[str] = []
    truncated = max_images is not None and max_images >= 0 and len(images) >= max_images
    # A kubelet that could not list its images reports none (pkg/kubelet/nodestatus/setters.go,
    # Images): an empty list proves nothing.
    truncated = truncated or not images
    for index, image in enumerate(images):
        if not isinstance(image, Mapping):
            raise ValueError(f"node {name}: status.images[{index}]: not an object")
        image_names = image.get("names") or []
        if not isinstance(image_names, list):
            raise ValueError(f"node {name}: status.images[{index}].names: not a list")
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
    )
