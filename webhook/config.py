"""`image-preflight serve`'s flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from image_preflight.commands import (
    DEFAULT_LOG_LEVEL,
    DEFAULT_METRICS_PORT,
    add_log_level_argument,
    add_metrics_port_argument,
    runner,
)
from image_preflight.core.admission.review import MODES, UNKNOWN_POLICIES, Mode, Settings
from image_preflight.core.admission.steering import DEFAULT_MAX_NODES
from image_preflight.core.decide.decision import REQUIRE_ALL, REQUIRE_ANY, Verdict
from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES
from image_preflight.errors import UsageError
from image_preflight.kube.client import ClusterFlags, add_cluster_arguments
from image_preflight.webhook.tls import DEFAULT_TLS_VERSION, TLS_VERSIONS



def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the validating admission webhook",
        description="Deny workloads whose IfNotPresent/Never images are absent from the nodes they may land on.",
    )
    parser.add_argument("--tls-cert", type=Path, required=True, metavar="FILE")
    parser.add_argument("--tls-key", type=Path, required=True, metavar="FILE")
    parser.add_argument("--tls-min-version", choices=tuple(TLS_VERSIONS), default=DEFAULT_TLS_VERSION,
                        help="the oldest TLS version accepted (default %(default)s)")
    parser.add_argument("--client-ca", type=Path, metavar="FILE",
                        help="answer /validate and /mutate only for callers presenting a certificate from this CA "
                        "(the apiserver's, from its AdmissionConfiguration kubeConfigFile); default: any caller")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8443)
    add_metrics_port_argument(parser)
    parser.add_argument("--inventory", type=Path, metavar="SNAPSHOT", help="a snapshot file, re-read when it changes")
    add_cluster_arguments(parser, when="without --inventory: ")
    parser.add_argument("--mode", choices=MODES, default=Mode.ENFORCE)
    parser.add_argument("--unknown", choices=UNKNOWN_POLICIES, default=Verdict.ALLOW,
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
    add_log_level_argument(parser)
    parser.set_defaults(run=runner(ServeConfig, "image_preflight.webhook.command"))


@dataclass(frozen=True)
class ServeConfig:
    tls_cert: Path
    tls_key: Path
    tls_min_version: str = DEFAULT_TLS_VERSION
    client_ca: Path | None = None  # none: any caller may ask
    host: str = "0.0.0.0"
    port: int = 8443
    metrics_port: int = DEFAULT_METRICS_PORT  # 0: no /metrics
    inventory: Path | None = None  # none: watch the cluster
    cluster: ClusterFlags = ClusterFlags()
    mode: Mode = Mode.ENFORCE
    unknown: Verdict = Verdict.ALLOW
    require: str = REQUIRE_ALL
    steer: bool = False
    steer_max_nodes: int = DEFAULT_MAX_NODES
    max_images: int = DEFAULT_MAX_IMAGES
    node_selector: str | None = None
    max_inventory_age: float = 600.0
    tls_reload_interval: float = 10.0
    inventory_reload_interval: float = 5.0
    log_level: str = DEFAULT_LOG_LEVEL

    def __post_init__(self) -> None:
        if self.steer_max_nodes < 1:
            raise UsageError(f"--steer-max-nodes {self.steer_max_nodes}: must be 1 or more")
        if self.inventory is not None and self.cluster.given:
            raise UsageError("--kubeconfig and --context watch the cluster: give them or --inventory, not both")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeConfig:
        return cls(
            tls_cert=args.tls_cert, tls_key=args.tls_key, tls_min_version=args.tls_min_version,
            client_ca=args.client_ca, host=args.host, port=args.port,
            metrics_port=args.metrics_port, inventory=args.inventory, cluster=ClusterFlags.from_args(args),
            mode=args.mode, unknown=args.unknown, require=args.require, steer=args.steer,
            steer_max_nodes=args.steer_max_nodes, max_images=args.max_images, node_selector=args.node_selector,
            max_inventory_age=args.max_inventory_age, tls_reload_interval=args.tls_reload_interval,
            inventory_reload_interval=args.inventory_reload_interval, log_level=args.log_level,
        )

    @property
    def settings(self) -> Settings:
        """What the admission answers depend on."""
        return Settings(mode=self.mode, unknown=self.unknown, require=self.require, steer=self.steer,
                        max_steer_nodes=self.steer_max_nodes)
