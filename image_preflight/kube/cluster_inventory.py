"""The cluster's inventory, read once: every Node, the node agents' NodeImages and the Leases that
renew the hashed ones, every RuntimeClass, and each kubelet's nodeStatusMaxImages where the caller
may read its configz.

The result is one `kind: List`, what `inventory dump` writes and `scan` reads without
`--inventory`: the same document either way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.core.objects import as_mapping, as_text
from image_preflight.core.sources.node_status import CAP_ANNOTATION
from image_preflight.core.sources.runtime_lists import (
    AGENT_NAMESPACE,
    API_VERSION,
    GROUP,
    PLURAL,
    RUNTIME_KIND,
    VERSION,
    node_images_from_runtime,
    renewal,
    renewed,
)
from image_preflight.errors import InputError, UnavailableError
from image_preflight.kube.client import json_body
from image_preflight.kube.pages import Pages
from image_preflight.kube.status import describe_error

Note = Callable[[str], None]
_PAGE = 100  # objects per list call: NodeImages of busy nodes run to megabytes each
_TIMEOUT = (10.0, 120.0)
_CONFIGZ_TIMEOUT = (3.0, 5.0)  # a kubelet that does not answer must not hold the whole read
_CONFIGZ_WORKERS = 8


def read_cluster(api: kubernetes.client.ApiClient, *, now: float, note: Note,
                 agent_namespace: str = AGENT_NAMESPACE) -> dict:
    """The List document; `note` hears what was left out and why. Unreadable when the nodes
    cannot be listed. `agent_namespace`: where the agents' Leases are."""
    nodes = list_nodes(api)
    try:
        published = list_node_images(api)
    except NotServed:
        note(f"{PLURAL}.{GROUP} is not served (node agent not deployed?): node status only")
        published = []
    leases = list_renewals(api, agent_namespace, note) if published else []
    runtime_classes = _runtime_classes(api, note)
    caps = kubelet_caps(api, node_names(nodes), note)
    return snapshot(nodes, published, now=now, note=note, runtime_classes=runtime_classes, caps=caps, leases=leases)


def list_renewals(api: kubernetes.client.ApiClient, namespace: str, note: Note) -> list[dict]:
    """The Leases in the agents' namespace; none, with a note, where they may not be listed."""
    try:
        return list_all(functools.partial(kubernetes.client.CoordinationV1Api(api).list_namespaced_lease, namespace),
                        f"leases in {namespace}")
    except Unreadable as exc:
        note(f"{exc}: hashed lists count only until their observedAt + lease")
        return []


def list_nodes(api: kubernetes.client.ApiClient) -> list[dict]:
    """Every Node; Unreadable when they cannot be listed."""
    return list_all(kubernetes.client.CoreV1Api(api).list_node, "nodes")


def list_node_images(api: kubernetes.client.ApiClient) -> list[dict]:
    """Every NodeImages object; NotServed without the CRD, Unreadable otherwise."""
    return list_all(lambda **query: kubernetes.client.CustomObjectsApi(api).list_cluster_custom_object(
        GROUP, VERSION, PLURAL, **query), f"{PLURAL}.{GROUP}")


# Rounds of delete-then-list before an object that keeps coming back means an agent still runs.
_DELETE_ROUNDS = 3


def delete_node_images(api: kubernetes.client.ApiClient, *, settle_s: float, sleep: Callable[[float], None]
                       ) -> set[str]:
    """Delete every NodeImages object, list again after `settle_s` and delete what came back (a
    write in flight when the agents lost their rights); the names deleted. InputError when they
    cannot be listed or deleted, or still come back after a few rounds (an agent still runs)."""
    custom = kubernetes.client.CustomObjectsApi(api)
    deleted: set[str] = set()
    for _ in range(_DELETE_ROUNDS):
        try:
            names = [(obj.get("metadata") or {}).get("name", "") for obj in list_node_images(api)]
        except NotServed:  # no CRD: nothing to delete
            return deleted
        if not names:
            return deleted
        for name in names:
            try:
                custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name, _request_timeout=_TIMEOUT)
            except ApiException as exc:
                if exc.status != 404:
                    raise InputError(f"cannot delete {PLURAL}.{GROUP} {name}: {describe_error(exc)}") from None
            except Exception as exc:  # noqa: BLE001 - connection errors come in many types
                raise InputError(f"cannot delete {PLURAL}.{GROUP} {name}: {describe_error(exc)}") from None
            deleted.add(name)
        sleep(settle_s)
    raise InputError(f"{PLURAL}.{GROUP} {', '.join(sorted(names))} came back after each delete: a node agent still "
                     "runs (kubectl get pods -A -l app.kubernetes.io/name=image-preflight-agent)")


def node_names(nodes: list[dict]) -> list[str]:
    return [as_text(as_mapping(n.get("metadata")).get("name")) for n in nodes]


def snapshot(nodes: list[dict], published: list[dict], *, now: float, note: Note,
             runtime_classes: Iterable[dict] = (), caps: dict[str, int] | None = None,
             leases: Iterable[dict] = ()) -> dict:
    """The List document. NodeImages left out, each with a note: unreadable ones, those whose
    lease has ended (they would prove nothing) and those of nodes not in the list (a scan would
    take them for nodes every Job may land on); each kept one renewed by a Lease (`leases`) is
    followed by it. A node whose kubelet cap is known carries it in CAP_ANNOTATION."""
    items = [_with_cap(_item(node, "v1", "Node"), caps or {}) for node in nodes]
    names = {(node.get("metadata") or {}).get("name") for node in nodes}
    renewing = {pair[0]: (pair[1], lease) for lease in leases if (pair := renewal(lease)) is not None}
    for obj in published:
        name = (obj.get("metadata") or {}).get("name")
        try:
            images = node_images_from_runtime(obj)
        except ValueError as exc:
            note(f"{PLURAL}/{name}: left out: {exc}")
            continue
        if images.node not in names:
            note(f"{PLURAL}/{name}: left out: node {images.node} is not in the cluster")
        elif not renewed(images, (renewing.get(images.node) or (None,))[0]).conclusive(now):
            note(f"{PLURAL}/{name}: left out: its lease ended (is the agent on {images.node} running?)")
        else:
            items.append(_item(obj, API_VERSION, RUNTIME_KIND))
            if images.node in renewing:
                items.append(_item(renewing[images.node][1], "coordination.k8s.io/v1", "Lease"))
    items += (_item(obj, "node.k8s.io/v1", "RuntimeClass") for obj in runtime_classes)
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


class KubeletUnread(NamedTuple):
    """A kubelet endpoint the apiserver's node proxy did not answer with a JSON object: the HTTP
    status (None: no answer, or not JSON) and one line of why."""

    status: int | None
    why: str


def kubelet_reads(api: kubernetes.client.ApiClient, names: list[str], path: str,
                  timeout: tuple[float, float] = _CONFIGZ_TIMEOUT) -> dict[str, dict | KubeletUnread]:
    """GET /api/v1/nodes/NAME/proxy/PATH of each node, in parallel, as a JSON object or why not."""
    core = kubernetes.client.CoreV1Api(api)

    def read(name: str) -> dict | KubeletUnread:
        try:
            body = json_body(core.connect_get_node_proxy_with_path(name, path, _preload_content=False,
                                                                   _request_timeout=timeout))
        except ApiException as exc:
            return KubeletUnread(exc.status, describe_error(exc))
        except Exception as exc:  # noqa: BLE001 - a bad answer or connection, as many types
            return KubeletUnread(None, describe_error(exc))
        return body if isinstance(body, dict) else KubeletUnread(None, f"{path} is not a JSON object")

    wanted = [n for n in names if n]
    with ThreadPoolExecutor(_CONFIGZ_WORKERS) as pool:
        return dict(zip(wanted, pool.map(read, wanted)))


def kubelet_configs(api: kubernetes.client.ApiClient, names: list[str]) -> dict[str, dict | KubeletUnread]:
    """Each kubelet's configuration (configz `kubeletconfig`), read once for every use."""
    configs = {}
    for name, body in kubelet_reads(api, names, "configz").items():
        config = body.get("kubeletconfig") if isinstance(body, dict) else body
        configs[name] = config if isinstance(config, (dict, KubeletUnread)) else KubeletUnread(
            None, "configz holds no kubeletconfig")
    return configs


def kubelet_caps(api: kubernetes.client.ApiClient, names: list[str], note: Note,
                 configs: dict[str, dict | KubeletUnread] | None = None) -> dict[str, int]:
    """Each kubelet's nodeStatusMaxImages from /api/v1/nodes/NAME/proxy/configz, for the nodes
    whose configz the caller may read (nodes/proxy); the others are left to --max-images.
    `configs`: what kubelet_configs read, so that configz is read once."""
    if configs is None:
        configs = kubelet_configs(api, names)
    caps, failed = {}, []
    for name, config in configs.items():
        if isinstance(config, KubeletUnread):
            failed.append((name, "forbidden" if config.status == 403 else config.why))
            continue
        cap = config.get("nodeStatusMaxImages", 50)
        if not isinstance(cap, int) or isinstance(cap, bool):
            failed.append((name, "configz holds no nodeStatusMaxImages"))
        else:
            caps[name] = cap
    if any(why == "forbidden" for _, why in failed):
        note("cannot read the kubelets' configz (nodes/proxy is forbidden): caps from --max-images")
    elif failed:
        name, why = failed[0]
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        note(f"kubelet configz unreadable on {name}{more} ({why}): caps from --max-images")
    return caps


def _with_cap(item: dict, caps: dict[str, int]) -> dict:
    cap = caps.get(item["metadata"].get("name"))
    if cap is None:
        return item
    annotations = {**(item["metadata"].get("annotations") or {}), CAP_ANNOTATION: str(cap)}
    return {**item, "metadata": {**item["metadata"], "annotations": annotations}}


def _runtime_classes(api: kubernetes.client.ApiClient, note: Note) -> list[dict]:
    # Without them only pods naming a RuntimeClass go undecided: a note, not a failed read.
    try:
        return list_all(kubernetes.client.NodeV1Api(api).list_runtime_class, "runtimeclasses")
    except NotServed:
        note("runtimeclasses.node.k8s.io is not served: pods naming a RuntimeClass will be unknown")
    except Unreadable as exc:
        note(f"{exc}: pods naming a RuntimeClass will be unknown")
    return []


class Unreadable(UnavailableError):
    """The apiserver will not give these objects (forbidden, not served, failing); the message says which."""


class NotServed(Unreadable):
    """The resource is not served (404 on list)."""


def list_all(list_call: Callable[..., object], what: str) -> list[dict]:
    """Every object, in pages, as plain dicts. NotServed on 404, Unreadable otherwise."""
    try:
        return list(Pages(list_call, _PAGE, timeout=_TIMEOUT).items())
    except ApiException as exc:
        if exc.status == 404:
            raise NotServed(f"{what} are not served") from None
        raise Unreadable(f"cannot list {what}: {describe_error(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - connection errors come in many types
        raise Unreadable(f"cannot list {what}: {describe_error(exc)}") from None


def _item(obj: dict, api_version: str, kind: str) -> dict:
    # List items come without kind; managedFields are noise to a reader of the snapshot.
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "apiVersion": api_version, "kind": kind, "metadata": metadata}
