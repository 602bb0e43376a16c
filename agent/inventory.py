"""The runtime's image list as the agent publishes it, and when to publish it again (pure)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence

from image_preflight.agent.cri import RuntimeImage
from image_preflight.core.decide.inventory import image_key, image_keys
from image_preflight.core.decide.references import InvalidReference
from image_preflight.core.objects import as_mapping
from image_preflight.core.sources.runtime_lists import RENEW_WHEN_REMAINING, parse_time, runtime_object

CREATE, CHANGED, RENEW = "create", "changed", "renew"


def image_dicts(images: Iterable[RuntimeImage]) -> list[dict]:
    """NodeImages `spec.images` entries in a stable order (by id, names sorted), so equal sets
    give equal lists whatever order the runtime answered in."""
    return sorted(
        (
            {
                "id": image.id,
                "repoTags": sorted(image.repo_tags),
                "repoDigests": sorted(image.repo_digests),
                "size": image.size,
                "pinned": image.pinned,
            }
            for image in images
        ),
        key=lambda image: image["id"],
    )


def fingerprint(images: Sequence[Mapping]) -> str:
    """A digest of an image set, equal for equal sets in any order (from CRI or a stored object)."""
    canonical = sorted(
        (
            str(image.get("id") or ""),
            sorted(image.get("repoTags") or []),
            sorted(image.get("repoDigests") or []),
            int(image.get("size") or 0),
            bool(image.get("pinned")),
        )
        for image in images
    )
    return hashlib.sha256(json.dumps(canonical, separators=(",", ":")).encode()).hexdigest()


def sandbox_image_report(name: str, images: Sequence[Mapping]) -> dict:
    """`spec.sandboxImage`: the runtime's sandbox image and whether `images` hold it, compared as
    containerd's CRI resolves it (an image ID as is, else the normalised name: ParseDockerRef)."""
    try:
        wanted = image_key(name)
    except InvalidReference:  # the runtime cannot resolve it either
        return {"name": name, "present": False}
    present = any(
        wanted == image.get("id")
        or wanted in image_keys([*(image.get("repoTags") or ()), *(image.get("repoDigests") or ())])
        for image in images
    )
    return {"name": name, "present": present}


# The spec fields an agent reports beside its images: spec.sandboxImage (sandbox_image_report)
# and spec.pinning (core.image_gc.pinning.pinning_report).
OPTIONAL_SPEC = ("sandboxImage", "pinning")


def node_images_object(node: str, images: Sequence[Mapping], *, observed_at: float, lease_seconds: int,
                       spec: Mapping[str, Mapping | None] | None = None, hashes: Mapping | None = None) -> dict:
    """The NodeImages object; `spec.imageCount` is for `kubectl get` only (readers count names).
    `spec`: the OPTIONAL_SPEC fields it carries (a None value leaves one out); `hashes`: the
    images as `spec.imageHashes` (runtime_lists.image_hashes), None to list them."""
    extra = {name: value for name, value in (spec or {}).items() if value is not None}
    obj = runtime_object(node, images, observed_at=observed_at, lease_seconds=lease_seconds,
                         sandbox_image=extra.get("sandboxImage"), hashes=hashes)
    obj["spec"]["imageCount"] = len(images)
    if "pinning" in extra:
        obj["spec"]["pinning"] = dict(extra["pinning"])
    return obj


def publish_reason(
    stored: Mapping | None, images: Sequence[Mapping], *, now: float, lease_seconds: int,
    spec: Mapping[str, Mapping | None] | None = None, digests: tuple[str, str] | None = None,
    hashes: Mapping | None = None, renewed_at: float | None = None,
) -> str | None:
    """Why the object must be written now (CREATE, CHANGED, RENEW), or None to leave it.

    `stored` is the object as last read from or written to the apiserver; `spec` the OPTIONAL_SPEC
    fields it should carry (None: none). `digests`: the fingerprints of the stored images and of
    `images`, where the caller keeps them (a list of 10,000 images takes milliseconds to digest).
    `hashes`: the images' `spec.imageHashes` when they are published so (None: listed);
    `renewed_at`: when its Lease last renewed the stored list (None: never).
    """
    if stored is None:
        return CREATE
    stored_spec = as_mapping(stored.get("spec"))
    if hashes is not None:
        if "images" in stored_spec or stored_spec.get("imageHashes") != dict(hashes):
            return CHANGED
    else:
        stored_images = stored_spec.get("images")
        if not isinstance(stored_images, list) or not all(isinstance(i, Mapping) for i in stored_images):
            return CHANGED
        try:
            stored_digest, digest = (digests if digests is not None
                                     else (fingerprint(stored_images), fingerprint(images)))
        except (TypeError, ValueError):  # an object someone else wrote badly: ours replaces it
            return CHANGED
        if stored_digest != digest:
            return CHANGED
    for name in OPTIONAL_SPEC:
        value = (spec or {}).get(name)
        if stored_spec.get(name) != (dict(value) if value is not None else None):
            return CHANGED
    if stored_spec.get("leaseDurationSeconds") != lease_seconds:
        return RENEW
    try:
        observed_at = parse_time(stored_spec.get("observedAt"), "spec.observedAt")
    except ValueError:
        return RENEW
    if now >= max(observed_at, renewed_at or observed_at) + lease_seconds * (1 - RENEW_WHEN_REMAINING):
        return RENEW
    return None
