"""Prometheus metrics, on their own registry (served on the plain-HTTP metrics port)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.decide.workloads import WORKLOAD_KINDS

# Label values come from closed sets: a review's own text never becomes a label (one lone
# surrogate there would break every later scrape), and the series stay few.
_KINDS = WORKLOAD_KINDS
_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
DECISIONS = frozenset({"allow", "deny", "warn", "audit", "skip", "unreadable", "unknown", "no-eligible-node", "error",
                       "steered", "not-steered"})


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "image_preflight_admission_requests", "Admission reviews answered",
            ["kind", "operation", "decision"], registry=self.registry,
        )
        self.latency = Histogram(
            "image_preflight_admission_duration_seconds", "Time to answer an admission review",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.nodes = Gauge("image_preflight_inventory_nodes", "Nodes in the inventory", registry=self.registry)
        self.images = Gauge(
            "image_preflight_inventory_images", "Image names held, summed over nodes", registry=self.registry
        )
        self.truncated = Gauge(
            "image_preflight_inventory_truncated_nodes", "Nodes whose image list may be partial",
            registry=self.registry,
        )
        self.age = Gauge(
            "image_preflight_inventory_age_seconds", "Seconds since the inventory was last known current",
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, str], object] = {}
        self.watch_restarts = Counter(
            "image_preflight_watch_restarts", "Watch restarts (Nodes, NodeImages, RuntimeClasses) by reason",
            ["reason"], registry=self.registry
        )

    def count(self, kind: str, operation: str, decision: str) -> None:
        """One review answered; the label children are made once per combination."""
        key = (kind if kind in _KINDS else "other", operation if operation in _OPERATIONS else "other",
               decision if decision in DECISIONS else "other")
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests.labels(*key)
        child.inc()

    def track_inventory(self, current: Callable[[], Inventory], age: Callable[[], float]) -> None:
        """Read the inventory's figures at scrape time instead of on every change."""
        self.nodes.set_function(lambda: len(current()))
        self.images.set_function(lambda: current().image_count)
        self.truncated.set_function(lambda: sum(not n.complete for n in current().nodes))
        self.age.set_function(age)
