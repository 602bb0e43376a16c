"""Follow the needed-images ConfigMap for the node agent's pinning (list, then watch, by name).

The agent's RBAC may read this one ConfigMap only: RBAC authorizes a list or watch restricted by
resourceNames when it selects `metadata.name` by a field selector, so both ask for it by name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping

import kubernetes.client

from image_preflight.kube.watch import ResourceWatcher


def split_source(source: str) -> tuple[str, str]:
    """NAMESPACE/NAME as (namespace, name); ValueError naming what is wrong."""
    namespace, slash, name = source.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise ValueError(f"{source!r} is not NAMESPACE/NAME")
    return namespace, name


def needed_images_watcher(api_client: kubernetes.client.ApiClient, source: str,
                          on_change: Callable[[Mapping | None], None], **options) -> ResourceWatcher:
    """A ResourceWatcher (not started) calling `on_change` with the ConfigMap, or None once it is
    listed absent or deleted; `options` go to the watcher."""
    namespace, name = split_source(source)

    def replace(items: Iterable[dict]) -> None:  # the watcher passes the list as it pages
        found = list(items)
        on_change(found[0] if found else None)

    return ResourceWatcher(
        functools.partial(kubernetes.client.CoreV1Api(api_client).list_namespaced_config_map, namespace),
        replace=replace,
        upsert=on_change,
        delete=lambda _: on_change(None),
        what="configmap",
        field_selector=f"metadata.name={name}",
        **options,
    )
