"""Follow the cluster's Nodes into a sink: the webhook's live inventory, or a test's recorder."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Callable, Protocol

import kubernetes.client

from image_preflight.kube.watch import BACKOFF_MAX_S, ResourceWatcher


class NodeSink(Protocol):
    def replace_nodes(self, nodes: Iterable[dict]) -> None: ...

    def upsert_node(self, node: dict) -> None: ...

    def delete_node(self, name: str) -> None: ...


class NodeWatcher(ResourceWatcher):
    """Follows the cluster's Nodes into a NodeSink."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        sink: NodeSink,
        *,
        label_selector: str | None = None,
        watch_timeout_seconds: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = BACKOFF_MAX_S,
        on_restart: Callable[[str], None] | None = None,
        **options,
    ):
        """`options` go to ResourceWatcher (silence_timeout, ...)."""
        super().__init__(
            kubernetes.client.CoreV1Api(api_client).list_node,
            replace=sink.replace_nodes,
            upsert=sink.upsert_node,
            delete=lambda node: sink.delete_node(node["metadata"]["name"]),
            what="node",
            label_selector=label_selector,
            watch_timeout_seconds=watch_timeout_seconds,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            on_restart=on_restart,
            **options,
        )
