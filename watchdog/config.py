"""`image-preflight watchdog`'s flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from image_preflight.commands import (
    DEFAULT_LOG_LEVEL,
    DEFAULT_METRICS_PORT,
    add_log_level_argument,
    add_metrics_port_argument,
    runner,
)
from image_preflight.core.watchdog.job_failure import MODES, Mode
from image_preflight.errors import UsageError
from image_preflight.kube.client import ClusterFlags, add_cluster_arguments

# The kubelet retries a failed container start 10-15 s later (pkg/kubelet/kubelet.go backOffPeriod
# 10 s, pod_workers.go workerBackOffPeriodJitterFactor 0.5): 15 s lets that one retry show an image
# that arrived meanwhile. Any longer only lengthens every real failure (docs/deploy.md).
DEFAULT_GRACE_S = 15.0
ENFORCE_LABEL = "image-preflight.io/enforce=true"  # the webhook's namespaceSelector
WEBHOOK = "validate.image-preflight.io"  # the chart's ValidatingWebhookConfiguration


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
    parser.add_argument("--mode", choices=MODES, default=Mode.ENFORCE,
                        help="enforce fails the Job; audit only records (annotation, Event, log)")
    parser.add_argument("--include-always", action="store_true",
                        help="also act on failed pulls of imagePullPolicy Always images")
    parser.add_argument("--namespace-selector", default=ENFORCE_LABEL, metavar="LABELS",
                        help="the namespaces watched (default: the webhook's opt-in label, %(default)s)")
    parser.add_argument("--webhook-name", action="append", metavar="NAME",
                        help=f"whose denials in FailedCreate events fail the Job (repeatable; default {WEBHOOK})")
    add_metrics_port_argument(parser)
    parser.add_argument("--host", default="0.0.0.0", help="where /metrics listens")
    add_log_level_argument(parser)
    parser.set_defaults(run=runner(WatchdogConfig, "image_preflight.watchdog.command"))


@dataclass(frozen=True)
class WatchdogConfig:
    cluster: ClusterFlags = ClusterFlags()
    grace: float = DEFAULT_GRACE_S
    mode: Mode = Mode.ENFORCE
    include_always: bool = False
    namespace_selector: str = ENFORCE_LABEL
    webhook_names: frozenset[str] = frozenset((WEBHOOK,))
    metrics_port: int = DEFAULT_METRICS_PORT  # 0: no /metrics
    host: str = "0.0.0.0"
    log_level: str = DEFAULT_LOG_LEVEL

    def __post_init__(self) -> None:
        if self.grace < 0:
            raise UsageError(f"--grace {self.grace:g}: must be 0 or more")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WatchdogConfig:
        return cls(
            cluster=ClusterFlags.from_args(args), grace=args.grace, mode=args.mode,
            include_always=args.include_always, namespace_selector=args.namespace_selector,
            webhook_names=frozenset(args.webhook_name or (WEBHOOK,)), metrics_port=args.metrics_port,
            host=args.host, log_level=args.log_level,
        )
