"""A node's complete image list as the node agent publishes it (from the runtime over CRI).

    apiVersion: image-preflight.io/v1alpha1
    kind: NodeImages
    metadata: {name: <node>}
    spec:
      nodeName: <node>
      observedAt: "2026-11-29T19:00:00Z"
      leaseDurationSeconds: 300        # stale, so inconclusive, after observedAt + lease
      images: [{id, repoTags, repoDigests, size, pinned}, ...]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from image_preflight.core.inventory import NodeImages

GROUP = "image-preflight.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
RUNTIME_KIND = "NodeImages"
PLURAL = "nodeimages"


def parse_time(value: object, field: str) -> float:
    if not isinstance(value, str):
        raise ValueError(f"{field}: missing or not an RFC 3339 time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{field}: {value!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_names(image: Mapping, where: str) -> list[str]:
    """repoTags then repoDigests of one CRI image; ValueError names the field."""
    names: list[str] = []
    for field in ("repoTags", "repoDigests"):
        value = image.get(field) or []
        if not isinstance(value, list):
            raise ValueError(f"{where}.{field}: not a list")
        names += value
    return names


def node_images_from_runtime(obj: Mapping) -> NodeImages:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ValueError("spec: missing")
    meta = obj.get("metadata")
    node = spec.get("nodeName") or (meta.get("name") if isinstance(meta, Mapping) else None)
    if not isinstance(node, str) or not node:
        raise ValueError("spec.nodeName: missing")
    observed_at = parse_time(spec.get("observedAt"), "spec.observedAt")
    lease = spec.get("leaseDurationSeconds")
    if not isinstance(lease, int) or isinstance(lease, bool) or lease <= 0:
        raise ValueError("spec.leaseDurationSeconds: missing or not a positive integer")
    images = spec.get("images")
    if not isinstance(images, list):
        raise ValueError("spec.images: missing or not a list")
    names, ids = [], []
    for index, image in enumerate(images):
        if not isinstance(image, Mapping):
            raise ValueError(f"spec.images[{index}]: not an object")
        names += image_names(image, f"spec.images[{index}]")
        if image.get("id"):
            ids.append(image["id"])
    return NodeImages.from_names(
        node, names, ids=ids, complete=True, observed_at=observed_at, expires_at=observed_at + lease, source="cri"
    )


def runtime_object(node: str, images: Sequence[Mapping], *, observed_at: float, lease_seconds: int) -> dict:
    """The NodeImages object for `node`; images are dicts with id, repoTags, repoDigests, size, pinned."""
    return {
        "apiVersion": API_VERSION,
        "kind": RUNTIME_KIND,
        "metadata": {"name": node},
        "spec": {
            "nodeName": node,
            "observedAt": format_time(observed_at),
            "leaseDurationSeconds": lease_seconds,
            "images": [dict(image) for image in images],
        },
    }
