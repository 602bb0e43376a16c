"""`image-preflight inventory dump`: the cluster's inventory as one snapshot for offline scans.

A `kind: List` holding every Node (scheduling traits, node status' capped image list), every
current NodeImages object (the agents' complete lists) and every RuntimeClass (the scheduling a
pod naming one gains), which `scan --inventory` and `serve --inventory` read as they are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.errors import UsageError
from image_preflight.kube.watch import describe_error
from image_preflight.core.runtime_inventory import API_VERSION, GROUP, PLURAL, RUNTIME_KIND, VERSION, node_images_from_runtime

_PAGE = 100  # objects per list call: NodeImages of busy nodes run to megabytes each
_TIMEOUT = (10.0, 120.0)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("inventory", help="snapshots of the cluster's node inventory")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    dump = actions.add_parser(
        "dump",
        help="write every Node and NodeImages object as one List for offline scans",
        description="Write the cluster's Nodes and the node agents' current NodeImages objects as one "
        "kind: List, the snapshot `image-preflight scan --inventory` and `serve --inventory` read.",
    )
    dump.add_argument("--kubeconfig", type=Path, metavar="FILE",
                      help="default: the service account in a pod, else ~/.kube/config")
    dump.add_argument("--out", type=Path, metavar="FILE", help="write here, atomically (default: stdout)")
    dump.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from image_preflight.kube.client import api_client

    api = api_client(args.kubeconfig)
    try:
        nodes = _list_all(kubernetes.client.CoreV1Api(api).list_node, "nodes")
        try:
            published = _list_all(
                lambda **query: kubernetes.client.CustomObjectsApi(api).list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, **query
                ),
                f"{PLURAL}.{GROUP}",
            )
        except _NotServed:
            _note(f"{PLURAL}.{GROUP} is not served (node agent not deployed?): the snapshot holds node status only")
            published = []
        runtime_classes = _runtime_classes(api)
    finally:
        api.close()
    document = snapshot(nodes, published, now=time.time(), note=_note, runtime_classes=runtime_classes)
    text = json.dumps(document, separators=(",", ":")) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        _write_atomic(args.out, text)
    kinds = [item["kind"] for item in document["items"]]
    _note(f"{kinds.count('Node')} nodes, {kinds.count(RUNTIME_KIND)} NodeImages, "
          f"{kinds.count('RuntimeClass')} RuntimeClasses" + (f" written to {args.out}" if args.out else ""))
    return 0


def _runtime_classes(api: kubernetes.client.ApiClient) -> list[dict]:
    # Without them only pods naming a RuntimeClass go undecided: a note, not a failed dump.
    try:
        return _list_all(kubernetes.client.NodeV1Api(api).list_runtime_class, "runtimeclasses")
    except _NotServed:
        _note("runtimeclasses.node.k8s.io is not served: pods naming a RuntimeClass will be unknown")
    except UsageError as exc:
        _note(f"{exc}: pods naming a RuntimeClass will be unknown")
    return []


def snapshot(nodes: list[dict], published: list[dict], *, now: float, note: Callable[[str], None],
             runtime_classes: Iterable[dict] = ()) -> dict:
    """The List document. NodeImages left out, each with a note: unreadable ones, those whose
    lease has ended (they would prove nothing) and those of nodes not in the list (a scan would
    take them for nodes every Job may land on)."""
    items = [_item(node, "v1", "Node") for node in nodes]
    names = {(node.get("metadata") or {}).get("name") for node in nodes}
    for obj in published:
        name = (obj.get("metadata") or {}).get("name")
        try:
            images = node_images_from_runtime(obj)
        except ValueError as exc:
            note(f"{PLURAL}/{name}: left out: {exc}")
            continue
        if images.node not in names:
            note(f"{PLURAL}/{name}: left out: node {images.node} is not in the cluster")
        elif not images.conclusive(now):
            note(f"{PLURAL}/{name}: left out: its lease ended (is the agent on {images.node} running?)")
        else:
            items.append(_item(obj, API_VERSION, RUNTIME_KIND))
    items += (_item(obj, "node.k8s.io/v1", "RuntimeClass") for obj in runtime_classes)
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


class _NotServed(Exception):
    pass


def _list_all(list_call: Callable[..., object], what: str) -> list[dict]:
    items: list[dict] = []
    token = None
    while True:
        try:
            response = list_call(limit=_PAGE, _continue=token, _preload_content=False, _request_timeout=_TIMEOUT)
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
        except ApiException as exc:
            if exc.status == 404:
                raise _NotServed() from None
            raise UsageError(f"cannot list {what}: {describe_error(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - connection errors come in many types
            raise UsageError(f"cannot list {what}: {describe_error(exc)}") from None
        items += body.get("items") or []
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items


def _item(obj: dict, api_version: str, kind: str) -> dict:
    # List items come without kind; managedFields are noise to a reader of the snapshot.
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "apiVersion": api_version, "kind": kind, "metadata": metadata}


def _write_atomic(path: Path, text: str) -> None:
    directory = path.parent if str(path.parent) else Path(".")
    try:
        handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, prefix=f".{path.name}.",
                                             delete=False)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, 0o644)  # not the temporary file's 0600: a snapshot is for sharing
        os.replace(handle.name, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(handle.name)
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _note(message: str) -> None:
    print(f"image-preflight inventory dump: {message}", file=sys.stderr)
