"""`image-preflight scan`: drop the dataset rows whose rollout Job would wait for an absent image."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from image_preflight.cli import add_cluster_arguments
from image_preflight.errors import UsageError
from image_preflight.files.atomic import atomic_path
from image_preflight.scanner import datasets, output
from image_preflight.files.inventory import load_inventory_file
from image_preflight.scanner.judge import RowJudge, make_template
from image_preflight.scanner.render import TemplateError
from image_preflight.scanner.scan import scan
from image_preflight.core.decide.decision import REQUIRE_ALL, REQUIRE_ANY, REQUIRE_ONE_NODE
from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES
from image_preflight.core.sources.snapshots import SnapshotError, load_document
from image_preflight.image_set import compact_inventory


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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    now = time.time()
    if args.steer and args.require != REQUIRE_ALL:
        raise UsageError("--steer decides by one node holding every image: it takes no --require")
    if args.inventory and (args.kubeconfig or args.context):
        raise UsageError("--kubeconfig and --context read the cluster: give them or --inventory, not both")
    inventory = (load_inventory_file(args.inventory, max_images=args.max_images) if args.inventory
                 else _cluster_inventory(args, now))
    judge = RowJudge(
        _template(args), inventory, require=REQUIRE_ONE_NODE if args.steer else args.require,
        keep_unknown=args.keep_unknown, now=now
    )
    other_inputs = [*(args.inventory or []), *([args.template] if args.template else [])]
    outputs = (("--report", args.report), ("--missing-images", args.missing_images),
               ("--needed-images", args.needed_images))
    for option, target in outputs:
        if target is not None:
            datasets.refuse_overwrite(target, [*args.datasets, *other_inputs], option)
    _refuse_one_file_twice(outputs, args)
    stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    created = _make_out_dir(args.out_dir)
    try:
        # Every output is staged before the first row is judged: one that cannot be written stops
        # the scan with nothing written, and none is in place until all are complete.
        with ExitStack() as staged:
            report = staged.enter_context(atomic_path(args.report)) if args.report else None
            missing = staged.enter_context(atomic_path(args.missing_images)) if args.missing_images else None
            needed = staged.enter_context(atomic_path(args.needed_images)) if args.needed_images else None
            with _progress() as progress:
                result = scan(args.datasets, judge, out_dir=args.out_dir, progress=progress, protect=other_inputs,
                              needed=args.needed_images is not None)
            if report is not None:
                Path(report).write_text(output.report_text(result), encoding="utf-8")
            if missing is not None:
                Path(missing).write_text(output.missing_images_text(result), encoding="utf-8")
            if needed is not None:
                Path(needed).write_text(output.needed_images_text(result), encoding="utf-8")
    except BaseException:
        if created is not None:
            _remove_empty(created, args.out_dir)
        raise
    output.print_summary(result, stdout, inventory)
    return 1 if args.fail_on_drop and result.dropped else 0


def _refuse_one_file_twice(outputs: tuple[tuple[str, Path | None], ...], args: argparse.Namespace) -> None:
    """UsageError when two outputs (options, or an option and a file of --out-dir) name one file
    (as datasets.output_paths and refuse_overwrite tell files apart)."""
    written: dict[object, str] = {}
    for option, target in outputs:
        if target is None:
            continue
        other = written.setdefault(datasets.file_identity(target), option)
        if other != option:
            raise UsageError(f"{target}: {other} and {option} would write the same file")
    for path in args.datasets if args.out_dir is not None else ():
        other = written.get(datasets.file_identity(args.out_dir / path.name))
        if other is not None:
            raise UsageError(f"{args.out_dir / path.name}: {other} and --out-dir would write the same file")


def _make_out_dir(out_dir: Path | None) -> Path | None:
    """Create --out-dir (and its parents) when missing; the topmost folder created, if any."""
    if out_dir is None:
        return None
    if out_dir.exists():
        if not out_dir.is_dir():
            raise UsageError(f"{out_dir}: --out-dir is not a directory")
        return None
    top = out_dir
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    try:
        out_dir.mkdir(parents=True)
    except OSError as exc:
        raise UsageError(f"{out_dir}: cannot create --out-dir ({exc.strerror or exc})") from None
    return top


def _remove_empty(top: Path, out_dir: Path) -> None:
    """Undo _make_out_dir when the scan failed: nothing is left behind."""
    folder = out_dir
    while True:
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == top:
            return
        folder = folder.parent


def _cluster_inventory(args: argparse.Namespace, now: float):
    try:
        from image_preflight.kube.client import api_client
        from image_preflight.kube.cluster_inventory import read_cluster
    except ImportError:
        raise UsageError("reading the cluster needs the Kubernetes client: pip install 'image-preflight[kube]', "
                         "or give --inventory") from None
    api = api_client(args.kubeconfig, context=args.context)
    try:
        document = read_cluster(api, now=now, note=lambda text: print(f"image-preflight scan: {text}", file=sys.stderr))
    finally:
        api.close()
    try:
        inventory = load_document(document, source="the cluster", observed_at=now, max_images=args.max_images)
    except SnapshotError as exc:
        raise UsageError(str(exc)) from None
    return compact_inventory(inventory)


def _template(args: argparse.Namespace):
    try:
        if args.image is not None:
            template = make_template(None, args.image)
        else:
            try:
                text = args.template.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"{args.template}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
            template = make_template(text, None, name=str(args.template))
        template.check()
    except TemplateError as exc:
        raise UsageError(str(exc)) from None
    return template


class _progress:
    """A rich progress bar on stderr with the rows judged, their total as known so far and an ETA;
    only when stderr is a terminal."""

    def __enter__(self):
        if not sys.stderr.isatty():
            self._bar = None
            return None
        self._bar = Progress(
            TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
            console=Console(stderr=True), transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("rows", total=0)
        return self

    def advance(self, rows: int) -> None:
        self._bar.advance(self._task, rows)

    def add_total(self, rows: int) -> None:
        self._bar.update(self._task, total=self._bar.tasks[0].total + rows)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
