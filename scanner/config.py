"""`image-preflight scan`'s flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from image_preflight.commands import add_command, max_images_flag
from image_preflight.core.decide.decision import REQUIRE_ALL, REQUIRE_ANY, REQUIRE_ONE_NODE
from image_preflight.errors import UsageError
from image_preflight.flags import DIR, FILE, Flags, Kind, flag, flags_of
from image_preflight.kube.client import ClusterFlags

DATASET = Kind("DATASET", Path)


# What a scan writes on stdout: lines for a reader (a table on a terminal), or the report as JSON.
OUTPUTS = ("text", "json")


class ScanCluster(ClusterFlags):
    """The cluster a scan reads; where there is no kubeconfig, a snapshot will do."""

    instead = ", or scan against a snapshot with --inventory FILE"


def register(subparsers, epilog: str | None = None) -> None:
    add_command(
        subparsers, "scan", ScanConfig, "image_preflight.scanner.command",
        epilog=epilog,
        help="drop dataset rows whose rollout Job names an image the nodes do not hold",
        description="Render the rollout Job for every dataset row and drop the rows whose "
        "IfNotPresent/Never images are absent from the nodes the Job may land on. Rows are numbered "
        "from 0 in every format, as the Python API and pandas count them.",
    )


@dataclass(frozen=True)
class ScanConfig(Flags):
    datasets: tuple[Path, ...] = flag(kind=DATASET, positional=True, help=".jsonl, .json or .parquet")
    template: Path | None = flag(None, kind=FILE, one_of="source", help="the Jinja2 Job template the trainer uses")
    image: str | None = flag(None, kind=Kind("EXPR"), one_of="source",
                             help="instead of --template, one container's image, e.g. '{{ input.image_name }}:openai'")
    inventory: tuple[Path, ...] = flag((), kind=FILE, repeat=True,
                                       help="node snapshot: kubectl get nodes -o json, crictl/docker images, "
                                       "NodeImages, `image-preflight inventory dump`, or references one per line "
                                       "(repeatable)", unset="read the cluster of the current kubeconfig context")
    cluster: ClusterFlags = flags_of(ScanCluster, when="without --inventory: ")
    out_dir: Path | None = flag(None, kind=DIR, help="write each dataset's kept rows here, under its name",
                                unset="none")
    report: Path | None = flag(None, kind=FILE, help="write every dropped row, and every row kept unconfirmed, as JSON",
                               unset="none")
    missing_images: Path | None = flag(None, kind=FILE, help="write the distinct missing images, one a line, as the "
                                       "runtime names them (docker.io/library/...), to build or load", unset="none")
    needed_images: Path | None = flag(None, kind=FILE, help="write the distinct images of the kept rows in the same "
                                      "form, for the node agents to pin (docs/agent.md)", unset="none")
    output: str = flag("text", choices=OUTPUTS,
                       help="stdout: lines for a reader (a table on a terminal), or the --report JSON")
    require: str = flag(REQUIRE_ALL, choices=(REQUIRE_ALL, REQUIRE_ANY),
                        help="an image must be on all eligible nodes or on any one")
    steer: bool = flag(False, help="as `serve --steer` decides Jobs: keep a row when one eligible node holds all "
                       "its images (its pods will be steered there); not with --require")
    keep_unknown: bool = flag(False, help="keep rows whose images cannot be confirmed (counted and reported)")
    fail_on_drop: bool = flag(False, help="exit 1 when any row was dropped")
    max_images: int = max_images_flag()

    def check(self) -> None:
        if self.steer and self.require != REQUIRE_ALL:
            raise UsageError("--steer decides by one node holding every image: it takes no --require")
        if self.inventory and self.cluster.given:
            raise UsageError("--kubeconfig and --context read the cluster: give them or --inventory, not both")

    @property
    def rule(self) -> str:
        """What a row's images must satisfy: --steer's one node, else --require."""
        return REQUIRE_ONE_NODE if self.steer else self.require

    @property
    def inputs(self) -> list[Path]:
        """Every file read besides the datasets: never written."""
        return [*self.inventory, *([self.template] if self.template else [])]
