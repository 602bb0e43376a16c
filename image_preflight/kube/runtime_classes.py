"""Follow the cluster's RuntimeClasses (node.k8s.io/v1) into the webhook's LiveInventory."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import kubernetes.client

from image_preflight.kube.watch import ResourceWatcher

# How often a cluster that does not serve node.k8s.io/v1 is asked again.
ABSENT_RETRY_SECONDS = 60.0


class RuntimeClassSink(Protocol):
    def replace_runtime_classes(self, objects: Iterable[dict]) -> None: ...

    def upsert_runtime_class(self, obj: dict) -> None: ...

    def delete_runtime_class(self, obj: dict) -> None: ...


def runtime_class_watcher(api_client: kubernetes.client.ApiClient, sink: RuntimeClassSink,
                          **options) -> ResourceWatcher:
    """A ResourceWatcher over RuntimeClasses feeding `sink`, not started; `options` go to it."""
    return ResourceWatcher(
        kubernetes.client.NodeV1Api(api_client).list_runtime_class,
        replace=sink.replace_runtime_classes,
        upsert=sink.upsert_runtime_class,
        delete=sink.delete_runtime_class,
        what="runtimeclass",
        **{"absent_retry": ABSENT_RETRY_SECONDS, **options},
    )
