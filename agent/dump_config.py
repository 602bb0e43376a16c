"""`image-preflight inventory dump`'s flags and the frozen config they map onto; the runner is
dump_command.run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from image_preflight.commands import runner
from image_preflight.kube.client import ClusterFlags, add_cluster_arguments


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


@dataclass(frozen=True)
class DumpConfig:
    cluster: ClusterFlags = ClusterFlags()
    out: Path | None = None  # None: stdout

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DumpConfig:
        return cls(cluster=ClusterFlags.from_args(args), out=args.out)
