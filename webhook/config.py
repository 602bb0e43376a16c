"""`image-preflight serve`'s flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from image_preflight.commands import add_command, log_level_flag, max_images_flag, metrics_port_flag
from image_preflight.core.admission.settings import MODES, UNKNOWN_POLICIES, Mode, Settings
from image_preflight.core.admission.steering import DEFAULT_MAX_NODES
from image_preflight.core.decide.decision import REQUIRE_ALL, REQUIRE_ANY, Outcome, Requirement
from image_preflight.errors import UsageError
from image_preflight.flags import (
    ADDRESS,
    COUNT,
    FILE,
    NAME,
    PORT,
    SECONDS,
    SELECTOR,
    Flags,
    above,
    at_least,
    flag,
    flags_of,
)
from image_preflight.kube.client import ClusterFlags
from image_preflight.webhook.tls import DEFAULT_TLS_VERSION, TLS_VERSIONS

# A replica whose watch has said nothing this long is not ready. Above the longest silence the
# watch itself tolerates (kube/watch.py, SILENCE_TIMEOUT_S beyond a watch's timeoutSeconds), so a
# silent stream is replaced before the replica turns unready.
MAX_INVENTORY_AGE_S = 600.0
# Far above what the apiserver keeps open to a webhook (client-go/transport/cache.go keeps 25 idle
# connections a host, and opens one more for each call made while all are busy), and within the
# open files a Pod is given (webhook/limits.py).
MAX_CONNECTIONS = 1024



def register(subparsers, epilog: str | None = None) -> None:
    add_command(
        subparsers, "serve", ServeConfig, "image_preflight.webhook.command",
        epilog=epilog,
        help="run the validating admission webhook",
        description="Deny workloads whose IfNotPresent/Never images are absent from the nodes they may land on.",
    )


@dataclass(frozen=True)
class ServeConfig(Flags):
    tls_cert: Path = flag(kind=FILE, required=True, help="the serving certificate (PEM), re-read when it changes")
    tls_key: Path = flag(kind=FILE, required=True, help="its private key (PEM)")
    tls_min_version: str = flag(DEFAULT_TLS_VERSION, choices=tuple(TLS_VERSIONS),
                                help="the oldest TLS version accepted")
    client_ca: Path | None = flag(None, kind=FILE, unset="any caller",
                                  help="answer /validate and /mutate only for callers presenting a certificate from "
                                  "this CA (the apiserver's, from its AdmissionConfiguration kubeConfigFile)")
    client_names: frozenset[str] = flag(frozenset(), kind=NAME, name="--client-name", repeat=True,
                                        collect=frozenset, unset="any the --client-ca signed",
                                        help="with --client-ca: answer /validate and /mutate only for a certificate "
                                        "whose subject common name, or one of its DNS names, is NAME (repeatable)")
    max_connections: int = flag(MAX_CONNECTIONS, kind=COUNT, check=at_least(1),
                                help="the most connections held open, from their accept; one more closes the one "
                                "idle longest, never one being answered")
    host: str = flag("0.0.0.0", kind=ADDRESS, help="where HTTPS and /metrics listen")
    port: int = flag(8443, kind=PORT, help="the HTTPS port (0: any free one)")
    metrics_port: int = metrics_port_flag()
    inventory: Path | None = flag(None, kind=FILE, help="a snapshot file, re-read when it changes",
                                  unset="watch the cluster's Nodes, NodeImages and RuntimeClasses")
    cluster: ClusterFlags = flags_of(ClusterFlags, when="without --inventory: ")
    mode: Mode = flag(Mode.ENFORCE, choices=MODES, help="enforce denies; warn and audit admit everything and only "
                      "warn or log")
    unknown: Outcome = flag(Outcome.ALLOW, choices=UNKNOWN_POLICIES,
                            help="what an image no list can confirm does (allow: with a warning)")
    require: str = flag(REQUIRE_ALL, choices=(REQUIRE_ALL, REQUIRE_ANY),
                        help="where the images must be, for Pods, and for Jobs and other templates unless --steer")
    steer: bool = flag(False, help="serve POST /mutate, which restricts a Pod to the eligible nodes holding its "
                       "images; Jobs and other templates then need one eligible node holding every image")
    steer_max_nodes: int = flag(DEFAULT_MAX_NODES, kind=COUNT, check=at_least(1),
                                help="steer only when the patch names at most N nodes")
    max_images: int = max_images_flag()
    node_selector: str | None = flag(None, kind=SELECTOR, help="watch only these nodes", unset="every node")
    max_inventory_age: float = flag(MAX_INVENTORY_AGE_S, kind=SECONDS, check=above(0),
                                    help="not ready when the watch has been silent this long")
    tls_reload_interval: float = flag(10.0, kind=SECONDS, check=above(0),
                                      help="how often --tls-cert and --tls-key are checked for changes")
    inventory_reload_interval: float = flag(5.0, kind=SECONDS, check=above(0),
                                            help="how often --inventory is checked for changes")
    log_level: str = log_level_flag()

    def check(self) -> None:
        if self.inventory is not None and self.cluster.given:
            raise UsageError("--kubeconfig and --context watch the cluster: give them or --inventory, not both")
        if self.client_names and self.client_ca is None:
            # Without a CA nothing is verified: any caller could sign itself a certificate of any name.
            raise UsageError("--client-name needs --client-ca: a name is believed only from a certificate it signed")
        if "" in self.client_names:
            raise UsageError("--client-name '': give a name")

    @property
    def settings(self) -> Settings:
        """What the admission answers depend on."""
        return Settings(mode=self.mode, unknown=self.unknown, require=Requirement(self.require), steer=self.steer,
                        max_steer_nodes=self.steer_max_nodes)
