"""`image-preflight agent`'s flags and the frozen config they map onto; the runner is command.run.

Nothing here loads grpc or the Kubernetes client: `agent --help` answers at once."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from image_preflight.commands import add_command, log_level_flag, metrics_port_flag
from image_preflight.core.image_gc.pinning import DEFAULT_MAX_BYTES
from image_preflight.core.sources.runtime_lists import MAX_LEASE_S, RENEW_WHEN_REMAINING
from image_preflight.errors import UsageError
from image_preflight.flags import ADDRESS, COUNT, IMAGE, NAME, SECONDS, Flags, Kind, between, flag, flags_of
from image_preflight.kube.client import ClusterFlags

DEFAULT_CRI_ENDPOINT = "unix:///run/containerd/containerd.sock"  # containerd's own default
LIST_FORMS = ("images", "hashes")  # NodeImages' spec.images, or spec.imageHashes


# Kubernetes quantities' suffixes for bytes (k8s.io/apimachinery/pkg/api/resource). By hand: the
# client's parse_quantity loads the whole Kubernetes client, which no --help should wait for.
_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def _quantity(text: str) -> int:
    number = text.rstrip("kKMGTPi")
    suffix = text[len(number):]
    if not number.isdigit() or suffix not in _SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a quantity of bytes (such as 200Gi, 500G or 1073741824)")
    return int(number) * _SUFFIXES[suffix]


def _shown_quantity(size: int) -> str:
    for suffix in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        if size and size % _SUFFIXES[suffix] == 0:
            return f"{size // _SUFFIXES[suffix]}{suffix}"
    return str(size)


# At most an int64, as a resource.Quantity's Value() holds.
QUANTITY = Kind("QUANTITY", _quantity, between(0, 2**63 - 1), _shown_quantity)


def register(subparsers, epilog: str | None = None) -> None:
    add_command(
        subparsers, "agent", AgentConfig, "image_preflight.agent.command",
        epilog=epilog,
        help="publish this node's complete image list (CRI ListImages) as a NodeImages object",
        description="List the container runtime's images over CRI and keep this node's NodeImages "
        "object current (--publish), or print it once (--print).",
    )


@dataclass(frozen=True)
class AgentConfig(Flags):
    node: str = flag("", kind=NAME, env="NODE_NAME", help="this node's name")
    publish: bool = flag(False, one_of="mode", help="keep the NodeImages object current until SIGTERM")
    print_once: bool = flag(False, name="--print", one_of="mode",
                            help="print the NodeImages object as JSON once and exit")
    cri_endpoint: str = flag(DEFAULT_CRI_ENDPOINT, kind=Kind("ENDPOINT"), help="the runtime's CRI socket")
    interval: float = flag(30.0, kind=SECONDS, help="how often to list the images; with --publish above 0 and "
                           "below a third of --lease, so the lease is renewed before it ends")
    lease: int = flag(300, kind=Kind(SECONDS.metavar, int), check=lambda lease: None if 1 <= lease <= MAX_LEASE_S
                      else f"must be 1 to {MAX_LEASE_S}", help=f"how long a published list counts as current "
                      f"(1 to {MAX_LEASE_S})")
    list_form: str = flag(LIST_FORMS[0], choices=LIST_FORMS,
                          help="how the names are published: images lists each image as the runtime gives it; "
                          "hashes (spec.imageHashes) a thirtieth of the size, for clusters of hundreds of nodes, "
                          "which readers that predate spec.imageHashes cannot read (docs/agent.md, the published form)")
    cluster: ClusterFlags = flags_of(ClusterFlags, when="with --publish: ")
    exit_after_failures: int = flag(3, kind=COUNT, help="exit 1 after N cycles in a row without an answer from the "
                                    "runtime, so the kubelet restarts the container with a fresh socket mount "
                                    "(0: never)")
    image_events: bool = flag(True, name="--no-image-events", negate=True,
                              help="only list every --interval; by default containerd's image events also trigger a "
                              "list within about a second")
    sandbox_image: str | None = flag(None, kind=IMAGE, unset="the name the runtime gives over CRI",
                                     help="the runtime's sandbox (pause) image, reported when the runtime does not "
                                     "name it over CRI (containerd 2.x: its pinned_images.sandbox)")
    pin_needed_images: str | None = flag(None, kind=Kind("NAMESPACE/NAME"), unset="none",
                                         help="with --publish, pin the images this ConfigMap lists (scan "
                                         "--needed-images) against the kubelet's image GC, and unpin those it pinned "
                                         "once unlisted; needs containerd 1.6.25, 1.7.10 or 2.x (docs/agent.md)")
    pin_max_bytes: int = flag(DEFAULT_MAX_BYTES, kind=QUANTITY,
                              help="with --pin-needed-images, pin at most this many bytes of images (the rest are "
                              "reported refused), so that the list cannot keep the image GC from freeing the disk")
    write_policy: str | None = flag(None, kind=NAME, unset="not checked",
                                    help="with --publish, start only while the ValidatingAdmissionPolicy of this "
                                    "name and the binding of the same name (validationActions Deny) exist: the "
                                    "chart's keeps each agent to its own node's NodeImages")
    # Off unless asked: an agent may share the node's network (k3s, hostNetwork) with other servers.
    metrics_port: int = metrics_port_flag(default=0)
    host: str = flag("0.0.0.0", kind=ADDRESS, help="where /metrics listens, with --publish")
    log_level: str = log_level_flag()

    def check(self) -> None:
        if not self.node:
            raise UsageError("--node: not given and NODE_NAME is not set")
        if self.publish and not 0 < self.interval < self.lease * RENEW_WHEN_REMAINING:
            raise UsageError(
                f"--interval {self.interval:g}: must be above 0 and below a third of --lease "
                f"({self.lease * RENEW_WHEN_REMAINING:g} s), so the lease is renewed before it ends"
            )
        if self.write_policy is not None and not self.publish:
            raise UsageError("--write-policy: checked only with --publish, which writes")
        if self.pin_needed_images is not None:
            if not self.publish:
                raise UsageError("--pin-needed-images: pins only with --publish")
            from image_preflight.kube.needed_images import split_source

            try:
                split_source(self.pin_needed_images)
            except ValueError as exc:
                raise UsageError(f"--pin-needed-images: {exc}") from None
