"""`image-preflight serve`: the validating admission webhook."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import uvicorn
from prometheus_client import start_http_server

from image_preflight.errors import UsageError
from image_preflight.core.admission.review import MODES, Settings
from image_preflight.webhook.app import WebhookState, create_app
from image_preflight.core.decide.decision import REQUIRE_ALL, REQUIRE_ANY
from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES
from image_preflight.core.admission.steering import DEFAULT_MAX_NODES
from image_preflight.webhook import logs
from image_preflight.webhook.live_inventory import FileInventory, LiveInventory
from image_preflight.webhook.metrics import Metrics
from image_preflight.webhook.protocol import DeadlineProtocol
from image_preflight.webhook.tls import ReloadingContext


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the validating admission webhook",
        description="Deny workloads whose IfNotPresent/Never images are absent from the nodes they may land on.",
    )
    parser.add_argument("--tls-cert", type=Path, required=True, metavar="FILE")
    parser.add_argument("--tls-key", type=Path, required=True, metavar="FILE")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--metrics-port", type=int, default=9090, help="plain-HTTP /metrics (0: off)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--inventory", type=Path, metavar="SNAPSHOT", help="a snapshot file, re-read when it changes")
    source.add_argument("--kubeconfig", type=Path, metavar="FILE",
                        help="watch Nodes with this kubeconfig (default: in a pod its service account, else "
                        "$KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--mode", choices=MODES, default="enforce")
    parser.add_argument("--unknown", choices=("allow", "deny"), default="allow",
                        help="what an unconfirmed image does (default: allow with a warning)")
    parser.add_argument("--require", choices=(REQUIRE_ALL, REQUIRE_ANY), default=REQUIRE_ALL,
                        help="for Pods, and for Jobs and other templates unless --steer (default %(default)s)")
    parser.add_argument("--steer", action="store_true",
                        help="serve POST /mutate, which restricts a Pod to the eligible nodes holding its images; "
                        "Jobs and other templates then need one eligible node holding every image")
    parser.add_argument("--steer-max-nodes", type=int, default=DEFAULT_MAX_NODES, metavar="N",
                        help="steer only when the patch names at most N nodes (default %(default)s)")
    parser.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES, metavar="N",
                        help="the kubelets' nodeStatusMaxImages (-1: no cap; default %(default)s)")
    parser.add_argument("--node-selector", metavar="LABELS", help="watch only these nodes (a label selector)")
    parser.add_argument("--max-inventory-age", type=float, default=600.0, metavar="SECONDS",
                        help="not ready when the watch has been silent this long (default %(default)s)")
    parser.add_argument("--tls-reload-interval", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument("--inventory-reload-interval", type=float, default=5.0, metavar="SECONDS",
                        help="how often --inventory is checked for changes (default %(default)s)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    server = build_server(args)
    try:
        server.run()
    finally:
        stop_background(server)
    return 0


def stop_background(server: uvicorn.Server) -> None:
    """Stop what build_server started beside the server: pollers, the node watch, /metrics."""
    for stop in getattr(server, "background_stops", ()):
        stop()


def build_server(args: argparse.Namespace) -> uvicorn.Server:
    """The configured server, not yet running (`.run()` blocks; set `.should_exit` to stop, then
    call stop_background)."""
    if args.steer_max_nodes < 1:
        raise UsageError(f"--steer-max-nodes {args.steer_max_nodes}: must be 1 or more")
    for path in (args.tls_cert, args.tls_key):
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
    try:
        tls = ReloadingContext(args.tls_cert, args.tls_key, interval=args.tls_reload_interval)
    except Exception as exc:
        raise UsageError(f"{args.tls_cert}, {args.tls_key}: cannot load the certificate and key ({exc})") from None
    metrics = Metrics()
    source, age, ready, stop_source = _inventory_source(args, metrics)
    stops = [stop_source]
    metrics.track_inventory(lambda: source.current, age)
    state = WebhookState(
        inventory=lambda: source.current,
        ready=ready,
        settings=Settings(mode=args.mode, unknown=args.unknown, require=args.require, steer=args.steer,
                          max_steer_nodes=args.steer_max_nodes),
        metrics=metrics,
        write_decision=logs.decision_writer(),
    )
    tls.start()
    stops.append(tls.stop)
    if args.metrics_port:
        try:
            httpd, _ = start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
        except OSError as exc:
            stop_source()
            tls.stop()
            raise UsageError(f"--metrics-port {args.metrics_port}: cannot listen ({exc.strerror or exc})") from None
        stops.append(lambda: (httpd.shutdown(), httpd.server_close()))
    config = uvicorn.Config(
        create_app(state), host=args.host, port=args.port, http=DeadlineProtocol, loop="uvloop", log_level=args.log_level,
        access_log=False, timeout_keep_alive=75, lifespan="off",
        log_config=None,  # keep the root handler logs.configure set up (dictConfig would close it)
        proxy_headers=False,  # the apiserver calls directly; forwarded headers would only be spoofable
        # Given so uvicorn serves HTTPS; the context is replaced below with one that reloads.
        ssl_certfile=str(args.tls_cert), ssl_keyfile=str(args.tls_key),
    )
    config.load()
    config.ssl = tls.listening
    server = uvicorn.Server(config)
    server.tls = tls  # type: ignore[attr-defined]  # for tests and shutdown
    server.background_stops = tuple(stops)  # type: ignore[attr-defined]
    return server


def _inventory_source(args: argparse.Namespace, metrics: Metrics):
    if args.inventory is not None:
        source = FileInventory(args.inventory, max_images=args.max_images, interval=args.inventory_reload_interval)
        source.start()
        # A file is as current as its author made it: ready once read, age since last written.
        return source, lambda: time.time() - source.mtime, source.synced.is_set, source.stop
    from image_preflight.kube.client import api_client
    from image_preflight.kube.node_images import start_runtime_watch
    from image_preflight.kube.nodes import NodeWatcher
    from image_preflight.kube.runtime_classes import runtime_class_watcher

    api = api_client(args.kubeconfig)
    live = LiveInventory(max_images=args.max_images)
    watcher = NodeWatcher(
        api, live, label_selector=args.node_selector,
        on_restart=lambda reason: metrics.watch_restarts.labels(reason).inc(),
    )
    watcher.start()
    # The node agents' complete lists, where the CRD is installed; node status otherwise.
    runtime = start_runtime_watch(api, live, lambda reason: metrics.watch_restarts.labels(reason).inc())
    # Readiness does not wait for RuntimeClasses: until listed, a pod naming one is undecided
    # (unknown), while every other pod is decided as soon as the nodes are known.
    classes = runtime_class_watcher(api, live, on_restart=lambda reason: metrics.watch_restarts.labels(reason).inc())
    classes.start()

    def age() -> float:
        # Events and bookmarks both prove the view current, even when nothing changed.
        return float("inf") if watcher.last_sync is None else time.monotonic() - watcher.last_sync

    def stop() -> None:
        watcher.stop()
        runtime.stop()
        classes.stop()

    return live, age, lambda: live.synced.is_set() and age() < args.max_inventory_age, stop
