"""`image-preflight inventory dump`: the cluster's inventory as one snapshot for offline scans.

A `kind: List` holding every Node (scheduling traits, node status' capped image list, and the
kubelet's nodeStatusMaxImages where configz may be read), every current NodeImages object (the
agents' complete lists) and every RuntimeClass (the scheduling a pod naming one gains), which
`scan --inventory` and `serve --inventory` read as they are (see image_preflight.kube.cluster_inventory).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from image_preflight.cli import add_cluster_arguments
from image_preflight.core.sources.runtime_lists import RUNTIME_KIND
from image_preflight.files.atomic import write_atomic
from image_preflight.kube.client import api_client  # needs the kube extra: the CLI names it when absent
from image_preflight.kube.cluster_inventory import read_cluster


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
    dump.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    api = api_client(args.kubeconfig, context=args.context)
    try:
        document = read_cluster(api, now=time.time(), note=_note)
    finally:
        api.close()
    text = json.dumps(document, separators=(",", ":")) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        write_atomic(args.out, text)
    kinds = [item["kind"] for item in document["items"]]
    _note(f"{kinds.count('Node')} nodes, {kinds.count(RUNTIME_KIND)} NodeImages, "
          f"{kinds.count('RuntimeClass')} RuntimeClasses" + (f" written to {args.out}" if args.out else ""))
    return 0


def _note(message: str) -> None:
    print(f"image-preflight inventory dump: {message}", file=sys.stderr)
