"""`image-preflight agent`'s flags and the frozen config they map onto; the runner is command.run.

Nothing here loads grpc or the Kubernetes client: `agent --help` answers at once."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from image_preflight.commands import DEFAULT_LOG_LEVEL, add_log_level_argument, runner
from image_preflight.core.image_gc.pinning import DEFAULT_MAX_BYTES
from image_preflight.core.sources.runtime_lists import MAX_LEASE_S
from image_preflight.errors import UsageError
from image_preflight.kube.client import ClusterFlags, add_cluster_arguments

DEFAULT_CRI_ENDPOINT = "unix:///run/containerd/containerd.sock"  # agent.cri.DEFAULT_ENDPOINT


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="publish this node's complete image list (CRI ListImages) as a NodeImages object",
        description="List the container runtime's images over CRI and keep this node's NodeImages "
        "object current (--publish), or print it once (--print).",
    )
    parser.add_argument("--node", metavar="NAME", help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--cri-endpoint", default=DEFAULT_CRI_ENDPOINT, metavar="ENDPOINT",
                        help="the runtime's CRI socket (default %(default)s)")
    parser.add_argument("--interval", type=float, default=30.0, metavar="SECONDS",
                        help="how often to list the images (default %(default)g)")
    parser.add_argument("--lease", type=int, default=300, metavar="SECONDS",
                        help="how long a published list counts as current (default %(default)s)")
    add_cluster_arguments(parser, when="with --publish: ")
    parser.add_argument("--exit-after-failures", type=int, default=3, metavar="N",
                        help="exit 1 after N cycles in a row without an answer from the runtime, so the "
                        "kubelet restarts the container with a fresh socket mount (0: never; default %(default)s)")
    parser.add_argument("--no-image-events", dest="image_events", action="store_false",
                        help="only list every --interval; by default containerd's image events also trigger a list"
                        " within about a second")
    parser.add_argument("--sandbox-image", metavar="IMAGE",
                        help="the runtime's sandbox (pause) image, reported when the runtime does not name it over CRI"
                        " (containerd 2.x: its pinned_images.sandbox); a name from the runtime wins")
    parser.add_argument("--pin-needed-images", metavar="NAMESPACE/NAME",
                        help="pin the images this ConfigMap lists (scan --needed-images) against the kubelet's"
                        " image GC, and unpin those it pinned once unlisted; needs containerd 1.6.25, 1.7.10 or 2.x"
                        " (docs/agent.md)")
    parser.add_argument("--pin-max-bytes", default=f"{DEFAULT_MAX_BYTES // 2**30}Gi",
                        metavar="QUANTITY",
                        help="with --pin-needed-images, pin at most this many bytes of images (a Kubernetes quantity"
                        " such as 200Gi; the rest are reported refused), so that the list cannot keep the image GC"
                        " from freeing the disk (default %(default)s)")
    add_log_level_argument(parser)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--publish", action="store_true", help="keep the NodeImages object current until SIGTERM")
    mode.add_argument("--print", action="store_true", help="print the NodeImages object as JSON once and exit")
    parser.set_defaults(run=runner(AgentConfig, "image_preflight.agent.command"))


@dataclass(frozen=True)
class AgentConfig:
    node: str
    publish: bool  # else print once
    cri_endpoint: str = DEFAULT_CRI_ENDPOINT
    interval: float = 30.0
    lease: int = 300
    cluster: ClusterFlags = ClusterFlags()
    exit_after_failures: int = 3
    image_events: bool = True
    sandbox_image: str | None = None
    pin_needed_images: str | None = None  # NAMESPACE/NAME of the needed list
    pin_max_bytes: int = DEFAULT_MAX_BYTES
    log_level: str = DEFAULT_LOG_LEVEL

    def __post_init__(self) -> None:
        from image_preflight.agent.inventory import RENEW_WHEN_REMAINING  # loads grpc: not for --help

        if not self.node:
            raise UsageError("--node: not given and NODE_NAME is not set")
        if not 1 <= self.lease <= MAX_LEASE_S:
            raise UsageError(f"--lease: must be 1 to {MAX_LEASE_S} seconds, got {self.lease}")
        if self.publish and not 0 < self.interval < self.lease * RENEW_WHEN_REMAINING:
            raise UsageError(
                f"--interval: must be above 0 and below a third of --lease ({self.lease * RENEW_WHEN_REMAINING:g} s),"
                f" so the lease is renewed before it ends; got {self.interval:g}"
            )
        if self.pin_needed_images is not None:
            if not self.publish:
                raise UsageError("--pin-needed-images: pins only with --publish")
            from image_preflight.kube.needed_images import split_source

            try:
                split_source(self.pin_needed_images)
            except ValueError as exc:
                raise UsageError(f"--pin-needed-images: {exc}") from None
        if self.exit_after_failures < 0:
            raise UsageError(f"--exit-after-failures: must be 0 or more, got {self.exit_after_failures}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AgentConfig:
        return cls(
            node=args.node or os.environ.get("NODE_NAME") or "", publish=args.publish,
            cri_endpoint=args.cri_endpoint, interval=args.interval, lease=args.lease,
            cluster=ClusterFlags.from_args(args), exit_after_failures=args.exit_after_failures,
            image_events=args.image_events, sandbox_image=args.sandbox_image,
            pin_needed_images=args.pin_needed_images, pin_max_bytes=_quantity(args.pin_max_bytes, "--pin-max-bytes"),
            log_level=args.log_level,
        )


# Kubernetes quantities' suffixes for bytes (k8s.io/apimachinery/pkg/api/resource). By hand: the
# client's parse_quantity loads the whole Kubernetes client, which no --help should wait for.
_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def _quantity(text: str, flag: str) -> int:
    number = text.rstrip("kKMGTPi")
    suffix = text[len(number):]
    if not number.isdigit() or suffix not in _SUFFIXES:
        raise UsageError(f"{flag}: {text!r} is not a quantity of bytes (such as 200Gi, 500G or 1073741824)")
    return int(number) * _SUFFIXES[suffix]
