"""`image-preflight watchdog`: fail the Job whose Pod waits for an image its node will not get.

The runner: watchdog/config.py holds the flags and the config they map onto."""

from __future__ import annotations

import os
import socket

from image_preflight.core.watchdog.stalls import Stalls
from image_preflight.kube.write_policies import require
from image_preflight.service import Signals, Stops, configure_logging, serve_metrics
from image_preflight.watchdog.actions import Actions
from image_preflight.watchdog.config import WatchdogConfig
from image_preflight.watchdog.metrics import Metrics
from image_preflight.watchdog.runner import Watchdog
from image_preflight.watchdog.watches import watchers

# Pods that will not run again leave the watch (DELETED) as soon as they are terminal.
UNFINISHED_PODS = "status.phase!=Succeeded,status.phase!=Failed"
FAILED_CREATES = "involvedObject.kind=Job,reason=FailedCreate"
# The kubelets' reports of a Pod whose sandbox could not be created (pkg/registry/core/event/
# strategy.go, ToSelectableFields: reason and involvedObject.* are selectable).
SANDBOX_FAILURES = "involvedObject.kind=Pod,reason=FailedCreatePodSandBox"


def run(config: WatchdogConfig) -> int:
    configure_logging(config.log_level)
    stops = Stops()
    with Signals() as signals:
        try:
            watchdog = start(config, stops)
            signals.on_stop(watchdog.wake)
            signals.run(watchdog.run, "watchdog")
        finally:
            stops.close()
    return 0


def start(config: WatchdogConfig, stops: Stops) -> Watchdog:
    """Start the watches and /metrics (what stops them, in `stops`); the acting loop is the
    returned Watchdog's run(stop)."""
    api = config.cluster.client()
    stops.add(api.close)  # last: after every watch on it
    if config.write_policy is not None:
        # RBAC grants the patch and the create cluster-wide; only the policy narrows them. Helm
        # creates kinds it does not know after the workloads (pkg/releaseutil/kind_sorter.go), so
        # at install the first start may come before the policy: the restart finds it.
        require(api, config.write_policy, "its token may patch any Job and create Pods in any namespace")
    metrics = Metrics()
    stalls = Stalls(config.grace, include_always=config.include_always, webhooks=config.webhook_names)
    instance = os.environ.get("POD_NAME") or socket.gethostname()
    watchdog = Watchdog(stalls, Actions(api, mode=config.mode, instance=instance, webhooks=config.webhook_names,
                                                 agent_namespace=config.cluster.agent_namespace),
                        metrics)
    serve_metrics(config.metrics_port, config.host, metrics.registry, stops)

    def on_restart(reason: str) -> None:
        metrics.watch_restarts.labels(reason).inc()

    for watcher in watchers(api, watchdog, namespace_selector=config.namespace_selector,
                            pods=UNFINISHED_PODS, events=FAILED_CREATES, sandbox_events=SANDBOX_FAILURES,
                            on_restart=on_restart):
        watcher.start()
        stops.add(watcher.stop)
    return watchdog
