"""`image-preflight watchdog`: fail the Job whose Pod waits for an image its node will not get.

The runner: watchdog/config.py holds the flags and the config they map onto."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from prometheus_client import start_http_server

from image_preflight.core.watchdog.stalls import Stalls
from image_preflight.errors import UnavailableError
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
    logging.basicConfig(level=config.log_level.upper(), format="%(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stops = start(config, stop)
    try:
        stop.wait()
    finally:
        for halt in reversed(stops):
            halt()
    return 0


def start(config: WatchdogConfig, stop: threading.Event) -> list:
    """Start the watches, the acting loop and /metrics; returns what stops them, in start order."""
    api = config.cluster.client()
    metrics = Metrics()
    stalls = Stalls(config.grace, include_always=config.include_always, webhooks=config.webhook_names)
    instance = os.environ.get("POD_NAME") or socket.gethostname()
    watchdog = Watchdog(stalls, Actions(api, mode=config.mode, instance=instance, webhooks=config.webhook_names),
                        metrics)
    stops = []
    if config.metrics_port:
        try:
            httpd, _ = start_http_server(config.metrics_port, addr=config.host, registry=metrics.registry)
        except OSError as exc:
            raise UnavailableError(f"--metrics-port {config.metrics_port}: cannot listen ({exc.strerror or exc})") from None
        stops.append(lambda: (httpd.shutdown(), httpd.server_close()))
    on_restart = lambda reason: metrics.watch_restarts.labels(reason).inc()  # noqa: E731
    for watcher in watchers(api, watchdog, namespace_selector=config.namespace_selector,
                            pods=UNFINISHED_PODS, events=FAILED_CREATES, sandbox_events=SANDBOX_FAILURES,
                            on_restart=on_restart):
        watcher.start()
        stops.append(watcher.stop)
    loop = threading.Thread(target=watchdog.run, args=(stop,), name="watchdog", daemon=True)
    loop.start()
    stops.append(lambda: (stop.set(), watchdog.wake(), loop.join(timeout=10)))
    return stops
