"""`image-preflight doctor`'s flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

from dataclasses import dataclass

from image_preflight.commands import add_command, max_images_flag
from image_preflight.flags import LABELS, Flags, Kind, flag, flags_of
from image_preflight.kube.client import ClusterFlags

DEFAULT_ROLLOUT_NAMESPACE = "default"  # agent-lightning's examples/swe_smith/run.sh: AGL_NAMESPACE


def register(subparsers, epilog: str | None = None) -> None:
    add_command(
        subparsers, "doctor", DoctorConfig, "image_preflight.doctor.command",
        epilog=epilog,
        help="check the cluster end to end: webhook, certificate, namespaces, node lists, image GC",
        description="Check that the webhook is configured, reachable and trusted, which namespaces it "
        "checks, how much each node's image list proves, where rollout pods may land, and where the kubelet's "
        "image GC may delete a needed image. One line per finding with the command that fixes it; exit 0 "
        "healthy, 1 with problems, 2 cannot check.",
    )


@dataclass(frozen=True)
class DoctorConfig(Flags):
    cluster: ClusterFlags = flags_of(ClusterFlags)
    namespace: str = flag(DEFAULT_ROLLOUT_NAMESPACE, kind=Kind("NAMESPACE"), env="AGL_NAMESPACE",
                          help="where agent-lightning creates its Jobs")
    webhook_address: str | None = flag(None, kind=Kind("HOST:PORT"), unset="the Service's DNS name, in-cluster",
                                       help="read the served certificate here")
    max_images: int = max_images_flag(" where configz is not readable")
    node_selector: dict[str, str] = flag(default_factory=dict, kind=LABELS, unset="none",
                                         help="the rollout template's nodeSelector, as KEY=VALUE[,KEY=VALUE...] "
                                         "(agent-lightning's has none)")
