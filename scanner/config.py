"""`image-preflight scan`'s flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from image_preflight.commands import runner
from image_preflight.core.decide.decision import REQUIRE_ALL, REQUIRE_ANY, REQUIRE_ONE_NODE
from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES
from image_preflight.errors import UsageError
from image_preflight.kube.client import ClusterFlags, add_cluster_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "scan",
        help="drop dataset rows whose rollout Job names an image the nodes do not hold",
        description="Render the rollout Job for every dataset row and drop the rows whose "
        "IfNotPresent/Never images are absent from the nodes the Job may land on.",
    )
    parser.add_argument("datasets", nargs="+", type=Path, metavar="DATASET", help=".jsonl, .json or .parquet")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--template", type=Path, metavar="JOB.yaml", help="the Jinja2 Job template the trainer uses")
    source.add_argument("--image", metavar="EXPR", help="shortcut for one container, e.g. '{{ input.image_name }}:openai'")
    parser.add_argument("--inventory", type=Path, metavar="SNAPSHOT", action="append",
                        help="node snapshot: kubectl get nodes -o json, crictl/docker images, NodeImages, "
                        "`image-preflight inventory dump`, or references one per line (repeatable); "
                        "default: read the cluster of the current kubeconfig context")
    add_cluster_arguments(parser, when="without --inventory: ")
    parser.add_argument("--out-dir", type=Path, metavar="DIR", help="write each dataset's kept rows here")
    parser.add_argument("--report", type=Path, metavar="REPORT.json", help="write every dropped row as JSON")
    parser.add_argument("--missing-images", type=Path, metavar="FILE", help="write the distinct missing images")
    parser.add_argument("--needed-images", type=Path, metavar="FILE",
                        help="write the distinct images of the kept rows (pin these: docs/agent.md)")
    parser.add_argument("--require", choices=(REQUIRE_ALL, REQUIRE_ANY), default=REQUIRE_ALL,
                        help="an image must be on all eligible nodes (default) or on any one")
    parser.add_argument("--steer", action="store_true",
                        help="as `serve --steer` decides Jobs: keep a row when one eligible node holds all its "
                        "images (its pods will be steered there)")
    parser.add_argument("--keep-unknown", action="store_true", help="keep rows whose images cannot be confirmed")
    parser.add_argument("--fail-on-drop", action="store_true", help="exit 1 when any row was dropped")
    parser.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES, metavar="N",
                        help="the kubelet's nodeStatusMaxImages (-1: no cap; default %(default)s)")
    parser.set_defaults(run=runner(ScanConfig, "image_preflight.scanner.command"))


@dataclass(frozen=True)
class ScanConfig:
    datasets: tuple[Path, ...]
    template: Path | None = None  # exactly one of template and image
    image: str | None = None
    inventory: tuple[Path, ...] = ()  # none: read the cluster
    cluster: ClusterFlags = ClusterFlags()
    out_dir: Path | None = None
    report: Path | None = None
    missing_images: Path | None = None
    needed_images: Path | None = None
    require: str = REQUIRE_ALL
    steer: bool = False
    keep_unknown: bool = False
    fail_on_drop: bool = False
    max_images: int = DEFAULT_MAX_IMAGES

    def __post_init__(self) -> None:
        if (self.template is None) == (self.image is None):
            raise UsageError("give one of --template and --image")
        if self.steer and self.require != REQUIRE_ALL:
            raise UsageError("--steer decides by one node holding every image: it takes no --require")
        if self.inventory and self.cluster.given:
            raise UsageError("--kubeconfig and --context read the cluster: give them or --inventory, not both")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ScanConfig:
        return cls(
            datasets=tuple(args.datasets), template=args.template, image=args.image,
            inventory=tuple(args.inventory or ()), cluster=ClusterFlags.from_args(args), out_dir=args.out_dir,
            report=args.report, missing_images=args.missing_images, needed_images=args.needed_images,
            require=args.require, steer=args.steer, keep_unknown=args.keep_unknown, fail_on_drop=args.fail_on_drop,
            max_images=args.max_images,
        )

    @property
    def rule(self) -> str:
        """What a row's images must satisfy: --steer's one node, else --require."""
        return REQUIRE_ONE_NODE if self.steer else self.require

    @property
    def inputs(self) -> list[Path]:
        """Every file read besides the datasets: never written."""
        return [*self.inventory, *([self.template] if self.template else [])]
