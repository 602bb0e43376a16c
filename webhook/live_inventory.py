"""The inventory the webhook decides against, kept current by a node watch or a snapshot file.

Writers (the watch thread, the file poller) build a new immutable Inventory and swap it in;
request handlers read whichever is current without locking.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES, Inventory, NodeImages, overriding
from image_preflight.core.decide.runtime_classes import RuntimeClassScheduling, runtime_class_from_object
from image_preflight.core.decide.scheduling import SchedulingSpecError
from image_preflight.core.sources.node_status import node_images_from_node
from image_preflight.core.sources.runtime_lists import node_images_from_runtime, renewal, renewals, renewed
from image_preflight.errors import InputError
from image_preflight.files.inventory import load_inventory_file
from image_preflight.files.poll import Poller, file_stamp
from image_preflight.image_set import compact
from image_preflight.kube.node_images import runtime_node_name

log = logging.getLogger(__name__)

# How late a Lease's renewal may reach the decisions: renewals within it are published together.
RENEWALS_WITHIN_S = 0.5
PUBLISHED_BY = ("relist", "node", "node-images", "lease", "runtime-class")


class LiveInventory:
    """A NodeSink (see image_preflight.kube.nodes) holding each node's images from node status, with
    complete runtime lists (the node agent's) taking their place where present."""

    def __init__(self, *, max_images: int | None = DEFAULT_MAX_IMAGES) -> None:
        self.max_images = max_images
        self._lock = threading.Lock()
        self._status: dict[str, NodeImages] = {}
        self._runtime: dict[str, NodeImages] = {}
        self._renewals: dict[str, float] = {}  # node -> when its agent's Lease last renewed its list
        self._renewal_flush: threading.Timer | None = None  # renewals not yet published, publishing soon
        self._renewed: set[str] = set()  # the nodes whose renewals those are
        self._classes: dict[str, RuntimeClassScheduling] = {}
        self._warned_over_cap: set[str] = set()
        self.current = Inventory()
        self.synced = threading.Event()
        # Inventories published, by what changed (PUBLISHED_BY): each but a Lease's renewal starts
        # a new memory of decisions (image_preflight.core.decide.memory), so these say how often
        # reviews decide afresh.
        self.published = dict.fromkeys(PUBLISHED_BY, 0)

    # NodeSink
    def replace_nodes(self, nodes: Iterable[dict]) -> None:
        converted = {}
        for node in nodes:
            item = self._convert(node)
            if item is not None:
                converted[item.node] = item
        with self._lock:
            self._status = converted
            self._publish("relist")
        self.synced.set()

    def upsert_node(self, node: dict) -> None:
        item = self._convert(node)
        if item is None:
            return
        with self._lock:
            held = self._status.get(item.node)
            # A kubelet's heartbeat rewrites Node status without changing what a decision reads: a
            # status list carries no lease, so only its observation time differs. Publishing it
            # would rebuild the inventory and forget every decision (38 a second at 5,000 nodes).
            if held is not None and replace(item, observed_at=held.observed_at) == held:
                return
            self._status[item.node] = item
            self._publish_nodes((item.node,), "node")

    def delete_node(self, name: str) -> None:
        with self._lock:
            self._status.pop(name, None)
            self._publish_nodes((name,), "node")

    def replace_runtime(self, lists: list[NodeImages]) -> None:
        with self._lock:
            self._runtime = {item.node: item for item in lists}
            self._publish("relist")

    # The NodeImages objects the node agents publish (see image_preflight.kube.node_images).
    def replace_runtime_objects(self, objects: Iterable[dict]) -> None:
        lists = [item for item in map(self._convert_runtime, objects) if item is not None]
        self.replace_runtime(lists)

    def upsert_runtime(self, obj: dict) -> None:
        item = self._convert_runtime(obj)
        with self._lock:
            if item is None:
                node = runtime_node_name(obj)
                # A list that no longer reads must not keep proving absences.
                if node is not None:
                    self._runtime.pop(node, None)
            else:
                node = item.node
                self._runtime[node] = item
            self._publish_nodes((node,), "node-images")

    def delete_runtime(self, node: str) -> None:
        with self._lock:
            self._runtime.pop(node, None)
            self._publish_nodes((node,), "node-images")

    # The node agents' Leases (see image_preflight.kube.node_images.renewal_watcher).
    def replace_renewals(self, leases: Iterable[dict]) -> None:
        found = renewals(leases)
        with self._lock:
            self._renewals = found
            self._publish("relist")

    def upsert_renewal(self, lease: dict) -> None:
        found = renewal(lease)
        with self._lock:
            if found is None:
                name = _name(lease)
                if name is not None:
                    self._renewals.pop(name, None)
                self._publish_nodes((name,), "lease")
                return
            self._renewals[found[0]] = found[1]
            self._renewed.add(found[0])
            # A renewal comes a third of a lease before the list would run out, and every node's
            # comes once a renewal period: publishing each at once would build a new inventory per
            # renewal (0.5 ms each at 5,000 nodes). They are published together, at most
            # RENEWALS_WITHIN_S late, and each changes only its own node's list.
            if self._renewal_flush is None:
                self._renewal_flush = threading.Timer(RENEWALS_WITHIN_S, self._flush_renewals)
                self._renewal_flush.daemon = True
                self._renewal_flush.start()

    def _flush_renewals(self) -> None:
        with self._lock:
            self._renewal_flush = None
            renewed, self._renewed = self._renewed, set()
            self._publish_nodes(renewed, "lease")

    def delete_renewal(self, lease: dict) -> None:
        with self._lock:
            name = _name(lease)
            if name is not None:
                self._renewals.pop(name, None)
            self._publish_nodes((name,), "lease")

    # RuntimeClasses (see image_preflight.kube.runtime_classes).
    def replace_runtime_classes(self, objects: Iterable[dict]) -> None:
        classes = dict(filter(None, map(self._convert_class, objects)))
        with self._lock:
            self._classes = classes
            self._publish("runtime-class")

    def upsert_runtime_class(self, obj: dict) -> None:
        converted = self._convert_class(obj)
        with self._lock:
            if converted is not None:
                self._classes[converted[0]] = converted[1]
            elif (name := _name(obj)) is not None:
                # Unreadable now: its old scheduling must not go on deciding.
                self._classes.pop(name, None)
            self._publish("runtime-class")

    def delete_runtime_class(self, obj: dict) -> None:
        name = _name(obj)
        with self._lock:
            if name is not None:
                self._classes.pop(name, None)
            self._publish("runtime-class")

    def _convert_class(self, obj: dict) -> tuple[str, RuntimeClassScheduling] | None:
        try:
            return runtime_class_from_object(obj)
        except SchedulingSpecError as exc:
            log.warning("ignoring a RuntimeClass the API returned: %s", exc)
            return None

    def _convert_runtime(self, obj: dict) -> NodeImages | None:
        try:
            return compact(node_images_from_runtime(obj))
        except ValueError as exc:
            log.warning("ignoring NodeImages %s: %s", runtime_node_name(obj), exc)
            return None

    def _convert(self, node: dict) -> NodeImages | None:
        try:
            item = compact(node_images_from_node(node, observed_at=time.time(), max_images=self.max_images))
        except ValueError as exc:
            log.warning("ignoring a node the API returned: %s", exc)
            return None
        if item.over_cap is not None and item.node not in self._warned_over_cap:
            self._warned_over_cap.add(item.node)  # once per node, not on every status update
            log.warning("node %s lists more images than --max-images %d: its kubelet's nodeStatusMaxImages is "
                        "higher, so its list proves nothing; set --max-images to that value (-1: no cap)",
                        item.node, item.over_cap)
        return item

    def _publish(self, by: str) -> None:
        """Publish every node afresh (a relist, a RuntimeClass changed)."""
        self._swap(Inventory(filter(None, map(self._node, self._status)), dict(self._classes)), by)

    def _publish_nodes(self, names: Iterable[str | None], by: str) -> None:
        """Publish these nodes' lists alone: a change on one node costs one node's work."""
        self._swap(self.current.updated({name: self._node(name) for name in names if name is not None}), by)

    def _swap(self, inventory: Inventory, by: str) -> None:
        self.current = _indexed(inventory)
        self.published[by] += 1

    def _node(self, name: str) -> NodeImages | None:
        """What decisions read of `name`: its status list, or its agent's list as last renewed.
        A runtime list outlives its node's deletion; without the Node it must not come back."""
        status = self._status.get(name)
        if status is None:
            return None
        listed = self._runtime.get(name)
        return status if listed is None else overriding(status, renewed(listed, self._renewals.get(name)))


def _indexed(inventory: Inventory) -> Inventory:
    """`inventory` with its index of which nodes hold each name built (or rebuilt, once many lists
    changed) by the thread that publishes it, rather than by the first review to need it."""
    inventory.holder_index()
    return inventory


def _name(obj: object) -> str | None:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None  # a key of _classes: a list would not even hash


class FileInventory:
    """A snapshot file, re-read when it changes."""

    def __init__(self, path: Path, *, max_images: int | None = DEFAULT_MAX_IMAGES, interval: float = 5.0) -> None:
        self.path = path
        self.max_images = max_images
        self.interval = interval
        self.synced = threading.Event()
        self._stamp = file_stamp(path)
        self._rejected: tuple | None = None  # (stamp, reason) of the last version refused, said once
        self.current = _indexed(load_inventory_file(path, max_images=max_images))  # bad file at start: fail loudly
        self.synced.set()
        self._poller = Poller(self.reload_if_changed, interval=interval, name="inventory-file")

    @property
    def mtime(self) -> float:
        stat = self._stamp[0]
        return stat[0] / 1e9 if stat else 0.0

    def reload_if_changed(self) -> bool:
        stamp = file_stamp(self.path)
        if stamp[0] is None or stamp == self._stamp:
            return False
        try:
            self.current = _indexed(load_inventory_file(self.path, max_images=self.max_images))
        except InputError as exc:
            # Read again at every poll (a permission fixed changes no stamp), said once per version.
            if self._rejected != (stamp, str(exc)):
                self._rejected = (stamp, str(exc))
                log.warning("keeping the previous inventory: %s", exc)
            return False
        self._stamp, self._rejected = stamp, None
        log.info("reloaded inventory from %s: %d nodes", self.path, len(self.current))
        return True

    def start(self) -> threading.Thread:
        return self._poller.start()

    def stop(self) -> None:
        self._poller.stop()
