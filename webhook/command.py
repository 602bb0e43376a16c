"""`image-preflight serve`: the validating admission webhook.

The runner: webhook/config.py holds the flags and the config they map onto."""

from __future__ import annotations

import logging
import ssl
import time

import uvicorn

from image_preflight.errors import InputError
from image_preflight.service import Signals, Stops, configure_logging, line_writer, serve_metrics
from image_preflight.webhook.app import WebhookState, create_app
from image_preflight.webhook.config import ServeConfig
from image_preflight.webhook.limits import connection_bound, raise_open_files_limit
from image_preflight.webhook.live_inventory import FileInventory, LiveInventory
from image_preflight.webhook.metrics import Metrics
from image_preflight.webhook.protocol import DeadlineLoop, DeadlineProtocol
from image_preflight.webhook.tls import CallerNames, ReloadingContext

log = logging.getLogger(__name__)
# uvicorn's `loop` setting takes a loop factory's import string.
DEADLINE_LOOP = f"{DeadlineLoop.__module__}:{DeadlineLoop.__qualname__}"


class WebhookServer(uvicorn.Server):
    """uvicorn's server, with the reloading TLS context it listens with and what stops the work
    started beside it (pollers, the node watch, /metrics, the API client)."""

    def __init__(self, config: uvicorn.Config, tls: ReloadingContext, background: Stops) -> None:
        super().__init__(config)
        self.tls = tls
        self.background = background

    def stop(self) -> None:
        """End run() as uvicorn's own SIGTERM handling does."""
        self.should_exit = True


def run(config: ServeConfig) -> int:
    configure_logging(config.log_level)
    # SIGTERM and SIGINT stop the server from before /metrics answers. While serving, uvicorn's own
    # handlers take both (it drains open requests first); after, it puts back the handlers it found
    # and raises the signal it caught once more (its cooperative signal handling, 0.29). With the
    # default ones that would end the process before stop_background runs and the last log lines
    # ("Finished server process") leave the buffer; it finds Signals' instead, which only ask
    # again for the stop already done.
    with Signals() as signals:
        server = build_server(config)
        signals.on_stop(server.stop)
        try:
            server.run()
        finally:
            stop_background(server)
    return 0


def stop_background(server: WebhookServer) -> None:
    """Stop what build_server started beside the server, in the reverse order."""
    server.background.close()


def build_server(config: ServeConfig) -> WebhookServer:
    """The configured server, not yet running (`.run()` blocks; set `.should_exit` to stop, then
    call stop_background)."""
    for path in (config.tls_cert, config.tls_key, *((config.client_ca,) if config.client_ca else ())):
        if not path.is_file():
            raise InputError(f"{path}: no such file")
    if config.client_ca is not None:
        try:
            ssl.create_default_context(cafile=config.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise InputError(f"--client-ca {config.client_ca}: cannot load CA certificates ({exc})") from None
    try:
        tls = ReloadingContext(config.tls_cert, config.tls_key, interval=config.tls_reload_interval,
                               min_version=config.tls_min_version, client_ca=config.client_ca)
    except Exception as exc:
        raise InputError(f"{config.tls_cert}, {config.tls_key}: cannot load the certificate and key ({exc})") from None
    metrics = Metrics()
    stops = Stops()
    try:
        return _build_server(config, tls, metrics, stops)
    except BaseException:
        stops.close()
        raise


def _build_server(config: ServeConfig, tls: ReloadingContext, metrics: Metrics, stops: Stops) -> WebhookServer:
    source, age, ready = _inventory_source(config, metrics, stops)
    metrics.track_inventory(lambda: source.current, age)
    state = WebhookState(
        inventory=lambda: source.current,
        ready=ready,
        settings=config.settings,
        metrics=metrics,
        write_decision=line_writer("image_preflight.decision"),
        require_client_cert=config.client_ca is not None,
        client_names=CallerNames(config.client_names),
    )
    tls.start()
    stops.add(tls.stop)
    serve_metrics(config.metrics_port, config.host, metrics.registry, stops)
    return WebhookServer(_uvicorn_config(config, create_app(state), tls, metrics), tls, stops)


def _max_connections(config: ServeConfig) -> int:
    bound = connection_bound(config.max_connections, raise_open_files_limit())
    if bound < config.max_connections:
        log.warning("holding at most %d connections, not %d: the open files limit (RLIMIT_NOFILE) leaves no more",
                    bound, config.max_connections)
    return bound


def _uvicorn_config(config: ServeConfig, app, tls: ReloadingContext, metrics: Metrics) -> uvicorn.Config:
    """uvicorn's settings, all of them here. No `limit_concurrency`: it answers 503 beyond its
    bound while idle connections keep their places (webhook/protocol.py bounds the connections)."""
    http = DeadlineProtocol.bounded(_max_connections(config), metrics.connections_evicted.inc)
    settings = uvicorn.Config(
        app, host=config.host, port=config.port, http=http, loop=DEADLINE_LOOP, log_level=config.log_level,
        access_log=False, timeout_keep_alive=75, lifespan="off",
        log_config=None,  # keep the root handler configure_logging set up (dictConfig would close it)
        proxy_headers=False,  # the apiserver calls directly; forwarded headers would only be spoofable
        # HTTPS with the context that hands each handshake the newest certificate; uvicorn's
        # ssl_* settings, read only by the default factory, are not given.
        ssl_context_factory=lambda _config, _default: tls.listening,
    )
    settings.load()
    return settings


def _inventory_source(config: ServeConfig, metrics: Metrics, stops: Stops):
    """The inventory's source, how old its view is, and whether it is ready; what it started, in `stops`."""
    if config.inventory is not None:
        source = FileInventory(config.inventory, max_images=config.max_images,
                               interval=config.inventory_reload_interval)
        source.start()
        stops.add(source.stop)
        # A file is as current as its author made it: ready once read, age since last written.
        return source, lambda: time.time() - source.mtime, source.synced.is_set
    from image_preflight.kube.node_images import node_images_watcher, renewal_watcher
    from image_preflight.kube.nodes import node_watcher
    from image_preflight.kube.runtime_classes import runtime_class_watcher

    api = config.cluster.client()
    stops.add(api.close)  # last: after every watch on it
    live = LiveInventory(max_images=config.max_images)
    metrics.track_publications(lambda: live.published)

    def restarted(reason: str) -> None:
        metrics.watch_restarts.labels(reason).inc()

    watcher = node_watcher(api, live, label_selector=config.node_selector, on_restart=restarted)
    # The node agents' complete lists, where the CRD is installed; node status otherwise.
    runtime_lists = node_images_watcher(api, live, on_restart=restarted)
    renewals = renewal_watcher(api, live, config.cluster.agent_namespace, on_restart=restarted)
    for started in (watcher, runtime_lists, renewals, runtime_class_watcher(api, live, on_restart=restarted)):
        started.start()
        stops.add(started.stop)

    def age() -> float:
        # Events and bookmarks both prove the view current, even when nothing changed.
        return float("inf") if watcher.last_sync is None else time.monotonic() - watcher.last_sync

    # Readiness waits for the agents' lists (or the CRD's absence) and the Leases that renew them:
    # before them a node past the kubelet's 50-name cap proves nothing, and every Job needing an
    # image it lacks would be let through as unknown (20 s at 200 nodes: benchmarks/fleet.py). It
    # does not wait for RuntimeClasses: until listed, only a pod naming one is undecided.
    def ready() -> bool:
        return (live.synced.is_set() and runtime_lists.synced.is_set() and renewals.synced.is_set()
                and age() < config.max_inventory_age)

    return live, age, ready
