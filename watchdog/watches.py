"""The watches the watchdog follows, each into its sink methods."""

from __future__ import annotations

from collections.abc import Callable

import kubernetes.client

from image_preflight.kube.watch import ResourceWatcher
from image_preflight.watchdog.runner import Watchdog


def watchers(api: kubernetes.client.ApiClient, sink: Watchdog, *, namespace_selector: str, pods: str, events: str,
             sandbox_events: str | None = None, on_restart: Callable[[str], None] | None = None,
             **options) -> list[ResourceWatcher]:
    """Namespaces by label, unfinished Pods, the Job controller's FailedCreate Events and (with
    `sandbox_events`) the kubelets' FailedCreatePodSandBox Events by field, across all namespaces:
    one watch each, however many namespaces opt in. Two Event watches, since a field selector only
    ANDs its terms (k8s.io/apimachinery/pkg/fields). `options` go to each ResourceWatcher (backoff,
    timeouts)."""
    core = kubernetes.client.CoreV1Api(api)
    common = {"on_restart": on_restart, **options}
    found = [
        ResourceWatcher(core.list_namespace, replace=sink.replace_namespaces, upsert=sink.upsert_namespace,
                        delete=sink.delete_namespace, what="namespace", label_selector=namespace_selector, **common),
        ResourceWatcher(core.list_pod_for_all_namespaces, replace=sink.replace_pods, upsert=sink.upsert_pod,
                        delete=sink.delete_pod, what="pod", field_selector=pods, **common),
        ResourceWatcher(core.list_event_for_all_namespaces, replace=sink.replace_events, upsert=sink.upsert_event,
                        delete=sink.delete_event, what="event", field_selector=events, **common),
    ]
    if sandbox_events:
        found.append(ResourceWatcher(core.list_event_for_all_namespaces, replace=sink.replace_sandbox_events,
                                     upsert=sink.upsert_event, delete=sink.delete_event, what="sandbox-event",
                                     field_selector=sandbox_events, **common))
    return found
