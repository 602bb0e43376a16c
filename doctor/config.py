"""`image-preflight doctor`'s flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from image_preflight.commands import runner
from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES
from image_preflight.errors import UsageError
from image_preflight.kube.client import ClusterFlags, add_cluster_arguments

DEFAULT_ROLLOUT_NAMESPACE = "default"  # agent-lightning's examples/swe_smith/run.sh: AGL_NAMESPACE


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the cluster end to end: webhook, certificate, namespaces, node lists, image GC",
        description="Check that the webhook is configured, reachable and trusted, which namespaces it "
        "checks, how much each node's image list proves, where rollout pods may land, and where the kubelet's "
        "image GC may delete a needed image. One line per finding with the command that fixes it; exit 0 "
        "healthy, 1 with problems, 2 cannot check.",
    )
    add_cluster_arguments(parser)
    parser.add_argument("--namespace", metavar="NS", default=os.environ.get("AGL_NAMESPACE") or DEFAULT_ROLLOUT_NAMESPACE,
                        help="where agent-lightning creates its Jobs (default: $AGL_NAMESPACE, else %(default)s)")
    parser.add_argument("--webhook-address", metavar="HOST:PORT",
                        help="read the served certificate here (default: the Service's DNS name, in-cluster)")
    parser.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES, metavar="N",
                        help="the kubelets' nodeStatusMaxImages where configz is not readable (default %(default)s)")
    parser.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                        help="the rollout template's nodeSelector (agent-lightning's has none; repeatable)")
    parser.set_defaults(run=runner(DoctorConfig, "image_preflight.doctor.command"))


@dataclass(frozen=True)
class DoctorConfig:
    cluster: ClusterFlags = ClusterFlags()
    namespace: str = DEFAULT_ROLLOUT_NAMESPACE  # where the rollout Jobs are created
    webhook_address: str | None = None  # HOST:PORT; None: the Service's DNS name
    max_images: int = DEFAULT_MAX_IMAGES
    node_selector: dict[str, str] = field(default_factory=dict)  # the rollout template's

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DoctorConfig:
        return cls(cluster=ClusterFlags.from_args(args), namespace=args.namespace,
                   webhook_address=args.webhook_address, max_images=args.max_images,
                   node_selector=dict(_pair(item) for item in args.node_selector))


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--node-selector {text!r}: expected KEY=VALUE")
    return key, value
