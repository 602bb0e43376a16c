"""`image-preflight inventory`'s flags and the frozen configs they map onto: `dump` (the runner is
dump_command.run) and `delete` (delete_command.run)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from image_preflight.commands import runner
from image_preflight.errors import UsageError
from image_preflight.kube.client import ClusterFlags, add_cluster_arguments

DEFAULT_SETTLE_S = 5.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("inventory", help="snapshots of the cluster's node inventory")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    dump = actions.add_parser(
        "dump",
        help="write every Node, NodeImages and RuntimeClass as one List for offline scans",
        description="Write the cluster's Nodes (with each kubelet's nodeStatusMaxImages where its configz "
        "may be read), the node agents' current NodeImages objects and the RuntimeClasses as one kind: List, "
        "the snapshot `image-preflight scan --inventory` and `serve --inventory` read.",
    )
    add_cluster_arguments(dump)
    dump.add_argument("--out", type=Path, metavar="FILE", help="write here, atomically (default: stdout)")
    dump.set_defaults(run=runner(DumpConfig, "image_preflight.agent.dump_command"))
    delete = actions.add_parser(
        "delete",
        help="delete every NodeImages object, once the node agents are gone",
        description="Delete the node agents' NodeImages objects, as the Helm chart's uninstall hook does: "
        "a list left behind makes every image it does not name unknown on its node once its lease ends. "
        "Lists again after --settle seconds and deletes what a write still in flight brought back; an "
        "agent still running makes it fail (exit 2) naming the objects.",
    )
    add_cluster_arguments(delete)
    delete.add_argument("--settle", type=float, default=DEFAULT_SETTLE_S, metavar="SECONDS",
                        help="how long a write in flight may take to land (default %(default)s)")
    delete.set_defaults(run=runner(DeleteConfig, "image_preflight.agent.delete_command"))


@dataclass(frozen=True)
class DumpConfig:
    cluster: ClusterFlags = ClusterFlags()
    out: Path | None = None  # None: stdout

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DumpConfig:
        return cls(cluster=ClusterFlags.from_args(args), out=args.out)


@dataclass(frozen=True)
class DeleteConfig:
    cluster: ClusterFlags = ClusterFlags()
    settle: float = DEFAULT_SETTLE_S

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DeleteConfig:
        if not args.settle >= 0:
            raise UsageError(f"--settle {args.settle}: must be 0 or more")
        return cls(cluster=ClusterFlags.from_args(args), settle=args.settle)
