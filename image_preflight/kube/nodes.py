"""Follow the cluster's Nodes into a sink: the webhook's live inventory, or a test's recorder."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import kubernetes.client

from image_preflight.kube.watch import NODE_PAGE, ResourceWatcher


class NodeSink(Protocol):
    def replace_nodes(self, nodes: Iterable[dict]) -> None: ...

    def upsert_node(self, node: dict) -> None: ...

    def delete_node(self, name: str) -> None: ...


def node_watcher(api_client: kubernetes.client.ApiClient, sink: NodeSink, **options) -> ResourceWatcher:
    """A ResourceWatcher over Nodes feeding `sink`, not started; `options` go to it
    (label_selector, on_restart, backoff, timeouts)."""
    return ResourceWatcher(
        kubernetes.client.CoreV1Api(api_client).list_node,
        replace=sink.replace_nodes,
        upsert=sink.upsert_node,
        delete=lambda node: sink.delete_node(node["metadata"]["name"]),
        what="node",
        **{"page_size": NODE_PAGE, **options},
    )
