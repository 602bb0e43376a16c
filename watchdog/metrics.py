"""The watchdog's Prometheus metrics, on their own registry. Labels come from closed sets."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from image_preflight.core.watchdog.job_failure import Action
from image_preflight.core.watchdog.pull_failures import FAILED_SANDBOX, NEVER_AVAILABLE, PULL_FAILED

ACTIONS = frozenset(Action)
REASONS = NEVER_AVAILABLE | PULL_FAILED | {"FailedCreate", FAILED_SANDBOX}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.actions = Counter(
            "image_preflight_watchdog_actions", "What the watchdog did, by action and the kubelet's reason",
            ["action", "reason"], registry=self.registry,
        )
        self.delay = Histogram(
            "image_preflight_watchdog_action_delay_seconds",
            "From the first waiting status (or the denial) seen to the action",
            buckets=(0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 900), registry=self.registry,
        )
        self.pending = Gauge("image_preflight_watchdog_pending", "Stuck Pods and denied Jobs not yet due",
                             registry=self.registry)
        self.watch_restarts = Counter(
            "image_preflight_watch_restarts", "Watch restarts (Pods, Events, Namespaces) by reason",
            ["reason"], registry=self.registry,
        )

    def acted(self, action: str, reason: str, delay_s: float) -> None:
        self.actions.labels(action if action in ACTIONS else "other", reason if reason in REASONS else "other").inc()
        if action in (Action.FAILED, Action.AUDITED, Action.EVENT_ONLY):
            self.delay.observe(delay_s)

    def track_pending(self, count: Callable[[], int]) -> None:
        self.pending.set_function(count)
