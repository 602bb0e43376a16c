"""Prometheus metrics, on their own registry (served on the plain-HTTP metrics port)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from image_preflight.core.admission.answers import ReviewDecision
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.decide.workloads import WORKLOAD_KINDS

# Label values come from closed sets: a review's own text never becomes a label (one lone
# surrogate there would break every later scrape), and the series stay few.
_KINDS = WORKLOAD_KINDS
_OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
DECISIONS = frozenset(ReviewDecision)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Answered:
    """The reviews answered, by kind, operation and decision, and the time each took: plain
    numbers added to by the event loop alone, read whole at scrape time. prometheus_client's
    counter and histogram take a lock per addition: together a twentieth of an answer."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last: above every bound
        self.seconds = 0.0

    def add(self, key: tuple[str, str, str], seconds: float) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # le: the first bound >= seconds
        self.seconds += seconds

    def collect(self):
        requests = CounterMetricFamily("image_preflight_admission_requests", "Admission reviews answered",
                                       labels=["kind", "operation", "decision"])
        for key, count in list(self.counts.items()):
            requests.add_metric([str(value) for value in key], count)
        yield requests
        buckets, total = [], 0
        for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), list(self.buckets)):
            total += count
            buckets.append((bound, total))
        yield HistogramMetricFamily("image_preflight_admission_duration_seconds",
                                    "Time to answer an admission review", buckets=buckets, sum_value=self.seconds)


class Published:
    """The inventories a live view published, by what changed (LiveInventory.published), read at
    scrape time: how often reviews start deciding afresh."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self.counts = counts

    def collect(self):
        published = CounterMetricFamily("image_preflight_inventory_publications",
                                        "Inventories published, by what changed (a lease renewal keeps what "
                                        "decisions remember; any other change starts afresh)", labels=["by"])
        for by, count in dict(self.counts()).items():
            published.add_metric([by], count)
        yield published


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.answered = Answered()
        self.registry.register(self.answered)
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
        self.watch_restarts = Counter(
            "image_preflight_watch_restarts", "Watch restarts (Nodes, NodeImages, RuntimeClasses) by reason",
            ["reason"], registry=self.registry
        )
        self.connections_evicted = Counter(
            "image_preflight_connections_evicted", "Connections closed to hold --max-connections: the one idle "
            "longest, or a new one when every other was being answered", registry=self.registry
        )

    def count(self, kind: str, operation: str, decision: str, seconds: float) -> None:
        """One review answered in `seconds`."""
        key = (kind if kind in _KINDS else "other", operation if operation in _OPERATIONS else "other",
               decision if decision in DECISIONS else "other")
        self.answered.add(key, seconds)

    def track_publications(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self.registry.register(Published(counts))

    def track_inventory(self, current: Callable[[], Inventory], age: Callable[[], float]) -> None:
        """Read the inventory's figures at scrape time instead of on every change."""
        self.nodes.set_function(lambda: len(current()))
        self.images.set_function(lambda: current().image_count)
        self.truncated.set_function(lambda: sum(not n.complete for n in current().nodes))
        self.age.set_function(age)
