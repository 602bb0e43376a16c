"""`image-preflight watchdog`: fail the Job whose Pod waits for an image its node will not get."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading

# Imported here, not where used: without the 'watchdog' extra the CLI then names the extra to
# install instead of failing later with a traceback.
from prometheus_client import start_http_server

from image_preflight.cli import add_cluster_arguments
from image_preflight.core.watchdog.job_failure import MODES
from image_preflight.core.watchdog.stalls import Stalls
from image_preflight.errors import UsageError
from image_preflight.kube.client import api_client
from image_preflight.watchdog.actions import Actions
from image_preflight.watchdog.metrics import Metrics
from image_preflight.watchdog.runner import Watchdog
from image_preflight.watchdog.watches import watchers

# The kubelet retries a failed container start 10-15 s later (pkg/kubelet/kubelet.go backOffPeriod
# 10 s, pod_workers.go workerBackOffPeriodJitterFactor 0.5): 15 s lets that one retry show an image
# that arrived meanwhile. Any longer only lengthens every real failure (docs/deploy.md).
DEFAULT_GRACE_S = 15.0
ENFORCE_LABEL = "image-preflight.io/enforce=true"  # the webhook's namespaceSelector
WEBHOOK = "validate.image-preflight.io"  # deploy/base/webhook.yaml
# Pods that will not run again leave the watch (DELETED) as soon as they are terminal.
UNFINISHED_PODS = "status.phase!=Succeeded,status.phase!=Failed"
FAILED_CREATES = "involvedObject.kind=Job,reason=FailedCreate"
# The kubelets' reports of a Pod whose sandbox could not be created (pkg/registry/core/event/
# strategy.go, ToSelectableFields: reason and involvedObject.* are selectable).
SANDBOX_FAILURES = "involvedObject.kind=Pod,reason=FailedCreatePodSandBox"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "watchdog",
        help="fail a Job whose Pod cannot get its node-local image",
        description="Watch Pods in the opted-in namespaces; when a Job's Pod waits for an image its node "
        "will not get (ErrImageNeverPull, InvalidImageName, or a failed pull of an IfNotPresent image), or "
        "cannot start because its node's runtime lacks its sandbox image (FailedCreatePodSandBox), for longer "
        "than the grace, or the webhook denied its Pod, fail the Job at once.",
    )
    add_cluster_arguments(parser)
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, metavar="SECONDS",
                        help="how long a container must wait before its Job is failed (default %(default)g: "
                        "one kubelet retry)")
    parser.add_argument("--mode", choices=MODES, default="enforce",
                        help="enforce fails the Job; audit only records (annotation, Event, log)")
    parser.add_argument("--include-always", action="store_true",
                        help="also act on failed pulls of imagePullPolicy Always images")
    parser.add_argument("--namespace-selector", default=ENFORCE_LABEL, metavar="LABELS",
                        help="the namespaces watched (default: the webhook's opt-in label, %(default)s)")
    parser.add_argument("--webhook-name", action="append", metavar="NAME",
                        help=f"whose denials in FailedCreate events fail the Job (repeatable; default {WEBHOOK})")
    parser.add_argument("--metrics-port", type=int, default=9090, help="plain-HTTP /metrics (0: off)")
    parser.add_argument("--host", default="0.0.0.0", help="where /metrics listens")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.grace < 0:
        raise UsageError(f"--grace {args.grace:g}: must be 0 or more")
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stops = start(args, stop)
    try:
        stop.wait()
    finally:
        for halt in reversed(stops):
            halt()
    return 0


def start(args: argparse.Namespace, stop: threading.Event) -> list:
    """Start the watches, the acting loop and /metrics; returns what stops them, in start order."""
    api = api_client(args.kubeconfig, context=args.context)
    metrics = Metrics()
    stalls = Stalls(args.grace, include_always=args.include_always,
                    webhooks=frozenset(args.webhook_name or (WEBHOOK,)))
    instance = os.environ.get("POD_NAME") or socket.gethostname()
    watchdog = Watchdog(stalls, Actions(api, mode=args.mode, instance=instance), metrics)
    stops = []
    if args.metrics_port:
        try:
            httpd, _ = start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
        except OSError as exc:
            raise UsageError(f"--metrics-port {args.metrics_port}: cannot listen ({exc.strerror or exc})") from None
        stops.append(lambda: (httpd.shutdown(), httpd.server_close()))
    on_restart = lambda reason: metrics.watch_restarts.labels(reason).inc()  # noqa: E731
    for watcher in watchers(api, watchdog, namespace_selector=args.namespace_selector,
                            pods=UNFINISHED_PODS, events=FAILED_CREATES, sandbox_events=SANDBOX_FAILURES,
                            on_restart=on_restart):
        watcher.start()
        stops.append(watcher.stop)
    loop = threading.Thread(target=watchdog.run, args=(stop,), name="watchdog", daemon=True)
    loop.start()
    stops.append(lambda: (stop.set(), watchdog.wake(), loop.join(timeout=10)))
    return stops
