"""A node's complete image list as the node agent publishes it (from the runtime over CRI).

    apiVersion: image-preflight.io/v1alpha1
    kind: NodeImages
    metadata: {name: <node>}
    spec:
      nodeName: <node>
      observedAt: "2026-11-29T19:00:00Z"
      leaseDurationSeconds: 300        # stale, so inconclusive, after observedAt + lease
      images: [{id, repoTags, repoDigests, size, pinned}, ...]
      # or, in place of images: the names' hashes (image_hashes), a thirtieth of the size
      imageHashes: {algorithm: blake2b-48-rice, count, data}
      sandboxImage: {name, present}    # optional: the runtime's sandbox (pause) image, and
                                       # whether it holds it; absent: the runtime did not say

A list in imageHashes is renewed apart from it, by a Lease named after the node in the agents'
namespace (holderIdentity the node, renewTime when the agent last confirmed the list): current
until the later of observedAt and renewTime, plus leaseDurationSeconds.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from image_preflight.core.decide.inventory import NodeImages, image_keys

# image_hashes (numpy) is imported where a hashed list is read or written: the faces' flags read
# this module's constants, and no --help should wait for numpy.

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
        shown = repr(value) if len(value) <= 64 else f"a string of {len(value)} characters"
        raise ValueError(f"{field}: {shown} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(epoch: float) -> str:
    """A metav1.MicroTime, as a Lease's renewTime is written."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def string(value: object, field: str) -> str:
    """`value` as a string Kubernetes could hold; ValueError names the field. A lone surrogate
    (a JSON escape Go never writes) cannot be encoded in any answer or log line."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: expected a string, got {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{field}: not valid Unicode (a lone surrogate)") from None
    return value


def string_list(value: object, where: str, field: str) -> list[str]:
    """`where`'s `field`, a list of strings; null, absent or empty reads as none."""
    if not value:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where}.{field}: not a list")
    try:
        if "".join(value).isascii():  # the common case, checked at C speed; join refuses non-strings
            return value
    except TypeError:
        pass
    for index, item in enumerate(value):
        string(item, f"{where}.{field}[{index}]")
    return value


def image_names(image: Mapping[str, Any], where: str) -> list[str]:
    """repoTags then repoDigests of one CRI image; ValueError names the field."""
    tags = string_list(image.get("repoTags"), where, "repoTags")
    return tags + string_list(image.get("repoDigests"), where, "repoDigests")


def image_id(image: Mapping[str, Any], where: str) -> str | None:
    """The `id` of one CRI image; None when absent or empty."""
    value = image.get("id")
    if value is None or value == "":
        return None
    return value if type(value) is str and value.isascii() else string(value, f"{where}.id")


# Far above any image reference (docker/distribution reference: a 255-character name, a 128-character
# tag, a digest), so only a hostile object is refused; it bounds what messages and logs may quote.
_MAX_SANDBOX_NAME = 1024


def sandbox_missing(spec: Mapping[str, Any]) -> str | None:
    """The sandbox image `spec.sandboxImage` says the runtime lacks, or None when it holds it or the
    object does not say. The name is kept as the runtime's configuration writes it (containerd 2.x
    `pinned_images.sandbox`, 1.x `sandbox_image`), interned: every node lacking it shares one string."""
    report = spec.get("sandboxImage")
    if report is None:
        return None
    if not isinstance(report, Mapping):
        raise ValueError("spec.sandboxImage: not an object")
    name = report.get("name")
    if name is None or name == "":
        raise ValueError("spec.sandboxImage.name: missing")
    name = string(name, "spec.sandboxImage.name")
    if len(name) > _MAX_SANDBOX_NAME:
        raise ValueError(f"spec.sandboxImage.name: longer than {_MAX_SANDBOX_NAME} characters")
    present = report.get("present")
    if type(present) is not bool:
        raise ValueError("spec.sandboxImage.present: missing or not a boolean")
    return None if present else sys.intern(str(name))


# The longest lease a list may claim (the CRD's maximum too): a node that stopped keeps its list
# current at most this long. The agent's default is 300.
MAX_LEASE_S = 3600
# The agent publishes again once less than this share of the lease remains: a missed cycle or a
# slow apiserver then still leaves time to renew before readers see the list as stale.
RENEW_WHEN_REMAINING = 1 / 3


# The namespace of the node agents' Leases (the chart's); readers and agents take --agent-namespace.
AGENT_NAMESPACE = "image-preflight-agent"
# A Lease as the custom-objects calls name it, which agents and readers use for its writes and
# reads (agent/renewal.py says why).
LEASE_GROUP, LEASE_VERSION, LEASE_PLURAL = "coordination.k8s.io", "v1", "leases"


def renewal(lease: object) -> tuple[str, float] | None:
    """(node, renewTime) of a coordination.k8s.io/v1 Lease by which a node agent renews its list:
    named after the node and held by it (the agent's policy lets it write no other). None for any
    other Lease, or one without a readable renewTime."""
    if not isinstance(lease, Mapping):
        return None
    meta, spec = lease.get("metadata"), lease.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    node = meta.get("name")
    if not isinstance(node, str) or not node or spec.get("holderIdentity") != node:
        return None
    try:
        return node, parse_time(spec.get("renewTime"), "spec.renewTime")
    except ValueError:
        return None


def renewals(leases: Iterable[object]) -> dict[str, float]:
    """Each node's renewTime, from those of `leases` that renew a list (see renewal)."""
    return dict(pair for lease in leases if (pair := renewal(lease)) is not None)


def renewed(listed: NodeImages, at: float | None) -> NodeImages:
    """`listed` as its agent confirmed it at `at` (its Lease's renewTime): current for the list's
    lease from then on. An earlier renewal, or none, leaves it as written."""
    if at is None or listed.observed_at is None or listed.expires_at is None or at <= listed.observed_at:
        return listed
    return replace(listed, observed_at=at, expires_at=at + (listed.expires_at - listed.observed_at))


def lease_object(node: str, namespace: str, *, renewed_at: float, lease_seconds: int) -> dict[str, Any]:
    """The Lease by which `node`'s agent renews its list (KEP-589's lesson: a heartbeat of a few
    hundred bytes instead of the whole list again)."""
    return {"apiVersion": f"{LEASE_GROUP}/{LEASE_VERSION}", "kind": "Lease",
            "metadata": {"name": node, "namespace": namespace},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": lease_seconds,
                     "renewTime": format_micro_time(renewed_at)}}


def node_images_from_runtime(obj: Mapping[str, Any]) -> NodeImages:
    if not isinstance(obj, Mapping):
        raise ValueError(f"expected an object, got {type(obj).__name__}")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ValueError("spec: missing")
    meta = obj.get("metadata")
    node = spec.get("nodeName") or (meta.get("name") if isinstance(meta, Mapping) else None)
    if node is None or node == "":
        raise ValueError("spec.nodeName: missing")
    node = string(node, "spec.nodeName" if spec.get("nodeName") else "metadata.name")
    observed_at = parse_time(spec.get("observedAt"), "spec.observedAt")
    lease = spec.get("leaseDurationSeconds")
    if not isinstance(lease, int) or isinstance(lease, bool) or lease <= 0:
        raise ValueError("spec.leaseDurationSeconds: missing or not a positive integer")
    if lease > MAX_LEASE_S:
        raise ValueError(f"spec.leaseDurationSeconds: more than {MAX_LEASE_S} s, the longest a list may count")
    common: dict[str, Any] = dict(complete=True, observed_at=observed_at, expires_at=observed_at + lease,
                                  source="cri", sandbox_missing=sandbox_missing(spec))
    images, hashed = spec.get("images"), spec.get("imageHashes")
    if hashed is not None:
        from image_preflight.core.sources.image_hashes import ImageHashes, decode

        if images is not None:
            raise ValueError("spec: both images and imageHashes (one form at a time)")
        return NodeImages(node, None, ImageHashes(decode(hashed)), **common)
    if not isinstance(images, list):
        raise ValueError("spec.images: missing or not a list, and no spec.imageHashes")
    names, ids = [], []
    for index, image in enumerate(images):
        where = f"spec.images[{index}]"
        if not isinstance(image, Mapping):
            raise ValueError(f"{where}: not an object")
        names += image_names(image, where)
        found = image_id(image, where)
        if found:
            ids.append(found)
    return NodeImages.from_names(node, names, ids=ids, **common)


def image_hashes(images: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`spec.imageHashes` for images given as in `spec.images`."""
    from image_preflight.core.sources.image_hashes import encode

    return encode(image_keys(name for index, image in enumerate(images)
                             for name in image_names(image, f"images[{index}]")))


def runtime_object(node: str, images: Sequence[Mapping[str, Any]], *, observed_at: float, lease_seconds: int,
                   sandbox_image: Mapping[str, Any] | None = None,
                   hashes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The NodeImages object for `node`; images are dicts with id, repoTags, repoDigests, size, pinned.
    `sandbox_image` ({name, present}) becomes `spec.sandboxImage`; None leaves it out. `hashes`
    (image_hashes(images)) is published in place of the images."""
    spec: dict[str, Any] = {"nodeName": node, "observedAt": format_time(observed_at),
                            "leaseDurationSeconds": lease_seconds}
    if hashes is not None:
        spec["imageHashes"] = dict(hashes)
    else:
        spec["images"] = [dict(image) for image in images]
    if sandbox_image is not None:
        spec["sandboxImage"] = {"name": sandbox_image["name"], "present": bool(sandbox_image["present"])}
    return {"apiVersion": API_VERSION, "kind": RUNTIME_KIND, "metadata": {"name": node}, "spec": spec}
