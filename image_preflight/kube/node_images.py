"""Follow the node agents' NodeImages objects, and the Leases that renew the hashed ones, into the
webhook's LiveInventory.

Where an agent publishes, its complete list takes the place of the node status' capped one;
an expired lease makes that list inconclusive (see NodeImages.conclusive). Without the CRD
(a 404 on list) the watch waits quietly for it and node status stays the only source; without
the right to list the agents' Leases (a 403), hashed lists count until observedAt + lease only.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Protocol

import kubernetes.client

from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION
from image_preflight.kube.watch import NODE_PAGE, ResourceWatcher

# How often a missing CRD is looked for again.
ABSENT_RETRY_SECONDS = 60.0


class RuntimeSink(Protocol):
    def replace_runtime_objects(self, objects: Iterable[dict]) -> None: ...

    def upsert_runtime(self, obj: dict) -> None: ...

    def delete_runtime(self, node: str) -> None: ...


class RenewalSink(Protocol):
    def replace_renewals(self, leases: Iterable[dict]) -> None: ...

    def upsert_renewal(self, lease: dict) -> None: ...

    def delete_renewal(self, lease: dict) -> None: ...


def runtime_node_name(obj: object) -> str | None:
    """The node a NodeImages object speaks for: spec.nodeName, else its name."""
    if not isinstance(obj, Mapping):
        return None
    spec, meta = obj.get("spec"), obj.get("metadata")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if not node and isinstance(meta, Mapping):
        node = meta.get("name")
    return node if isinstance(node, str) and node else None


def node_images_watcher(api_client: kubernetes.client.ApiClient, sink: RuntimeSink, **options) -> ResourceWatcher:
    """A ResourceWatcher over NodeImages feeding `sink`, not started; `options` go to it."""
    return ResourceWatcher(
        functools.partial(
            kubernetes.client.CustomObjectsApi(api_client).list_cluster_custom_object, GROUP, VERSION, PLURAL
        ),
        replace=sink.replace_runtime_objects,
        upsert=sink.upsert_runtime,
        delete=lambda obj: sink.delete_runtime(runtime_node_name(obj) or ""),
        what="nodeimages",
        **{"absent_retry": ABSENT_RETRY_SECONDS, "page_size": NODE_PAGE, **options},
    )


def renewal_watcher(api_client: kubernetes.client.ApiClient, sink: RenewalSink, namespace: str,
                    **options) -> ResourceWatcher:
    """A ResourceWatcher over the Leases in the agents' `namespace` feeding `sink`, not started."""
    return ResourceWatcher(
        functools.partial(kubernetes.client.CoordinationV1Api(api_client).list_namespaced_lease, namespace),
        replace=sink.replace_renewals,
        upsert=sink.upsert_renewal,
        delete=sink.delete_renewal,
        what="leases",
        # A Lease is a few hundred bytes: pages of the default size (5,000 nodes' in 10 pages, not 1,000).
        **{"absent_retry": ABSENT_RETRY_SECONDS, "absent_statuses": (403, 404), **options},
    )
