"""`image-preflight inventory`'s flags and the frozen configs they map onto: `dump` (the runner is
dump.run) and `delete` (delete.run)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from image_preflight.commands import add_command
from image_preflight.flags import FILE, SECONDS, Flags, flag, flags_of
from image_preflight.kube.client import ClusterFlags

DEFAULT_SETTLE_S = 5.0


def register(subparsers, epilog: str | None = None) -> None:
    parser = subparsers.add_parser("inventory", help="snapshots of the cluster's node inventory", epilog=epilog)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_command(
        actions, "dump", DumpConfig, "image_preflight.inventory.dump",
        epilog=epilog,
        help="write every Node, NodeImages and RuntimeClass as one List for offline scans",
        description="Write the cluster's Nodes (with each kubelet's nodeStatusMaxImages where its configz "
        "may be read), the node agents' current NodeImages objects and the RuntimeClasses as one kind: List, "
        "the snapshot `image-preflight scan --inventory` and `serve --inventory` read.",
    )
    add_command(
        actions, "delete", DeleteConfig, "image_preflight.inventory.delete",
        epilog=epilog,
        help="delete every NodeImages object, once the node agents are gone",
        description="Delete the node agents' NodeImages objects, as the Helm chart's uninstall hook does: "
        "a list left behind makes every image it does not name unknown on its node once its lease ends. "
        "Lists again after --settle seconds and deletes what a write still in flight brought back; an "
        "agent still running makes it fail (exit 2) naming the objects.",
    )


@dataclass(frozen=True)
class DumpConfig(Flags):
    cluster: ClusterFlags = flags_of(ClusterFlags)
    out: Path | None = flag(None, kind=FILE, help="write here, atomically", unset="stdout")


@dataclass(frozen=True)
class DeleteConfig(Flags):
    cluster: ClusterFlags = flags_of(ClusterFlags)
    settle: float = flag(DEFAULT_SETTLE_S, kind=SECONDS, help="how long a write in flight may take to land")
