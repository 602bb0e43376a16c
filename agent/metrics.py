"""The agent's Prometheus metrics, on their own registry: what an alert on a silent node reads."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

# A cycle's outcome: the list published (or left as it was, unchanged and not due), the runtime
# not answering, or the apiserver refusing or not answering the write.
OUTCOMES = ("listed", "runtime_unavailable", "publish_failed")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cycles = Counter("image_preflight_agent_cycles", "List-and-publish cycles, by outcome", ["outcome"],
                              registry=self.registry)
        for outcome in OUTCOMES:
            self.cycles.labels(outcome)  # each at 0 from the start: a rate needs the series
        self.images = Gauge("image_preflight_agent_images", "Images the runtime listed last", registry=self.registry)
        self.listed_at = Gauge("image_preflight_agent_last_listed_timestamp_seconds",
                               "When the runtime last answered a list (Unix time)", registry=self.registry)
        self.published_at = Gauge("image_preflight_agent_last_published_timestamp_seconds",
                                  "When the node's list was last written or found current (Unix time)",
                                  registry=self.registry)
