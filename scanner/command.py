"""`image-preflight scan`: drop the dataset rows whose rollout Job would wait for an absent image."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from image_preflight.errors import UsageError
from image_preflight.scanner import datasets, output
from image_preflight.files.inventory import load_inventory_file
from image_preflight.scanner.judge import RowJudge, make_template
from image_preflight.scanner.render import TemplateError
from image_preflight.scanner.scan import scan
from image_preflight.core.decision import REQUIRE_ALL, REQUIRE_ANY
from image_preflight.core.inventory import DEFAULT_MAX_IMAGES


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
    parser.add_argument("--inventory", type=Path, required=True, metavar="SNAPSHOT", action="append",
                        help="node snapshot: kubectl get nodes -o json, crictl/docker images, NodeImages, "
                        "or references one per line (repeatable)")
    parser.add_argument("--out-dir", type=Path, metavar="DIR", help="write each dataset's kept rows here")
    parser.add_argument("--report", type=Path, metavar="REPORT.json", help="write every dropped row as JSON")
    parser.add_argument("--missing-images", type=Path, metavar="FILE", help="write the distinct missing images")
    parser.add_argument("--require", choices=(REQUIRE_ALL, REQUIRE_ANY), default=REQUIRE_ALL,
                        help="an image must be on all eligible nodes (default) or on any one")
    parser.add_argument("--keep-unknown", action="store_true", help="keep rows whose images cannot be confirmed")
    parser.add_argument("--fail-on-drop", action="store_true", help="exit 1 when any row was dropped")
    parser.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES, metavar="N",
                        help="the kubelet's nodeStatusMaxImages (-1: no cap; default %(default)s)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    now = time.time()
    inventory = load_inventory_file(args.inventory, max_images=args.max_images)
    judge = RowJudge(
        _template(args), inventory, require=args.require, keep_unknown=args.keep_unknown, now=now
    )
    if args.out_dir is not None and not args.out_dir.is_dir():
        raise UsageError(f"{args.out_dir}: --out-dir is not a directory")
    other_inputs = [*args.inventory, *([args.template] if args.template else [])]
    for option, target in (("--report", args.report), ("--missing-images", args.missing_images)):
        if target is not None:
            datasets.refuse_overwrite(target, [*args.datasets, *other_inputs], option)
    stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    with _progress() as advance:
        result = scan(args.datasets, judge, out_dir=args.out_dir, progress=advance, protect=other_inputs)
    # Files first: a reader of stdout that goes away (`| head`) must not cost the report.
    if args.report is not None:
        output.write_report(args.report, result)
    if args.missing_images is not None:
        output.write_missing_images(args.missing_images, result)
    output.print_summary(result, stdout)
    return 1 if args.fail_on_drop and result.dropped else 0


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
    """A rich progress bar on stderr, only when stderr is a terminal."""

    def __enter__(self):
        if not sys.stderr.isatty():
            self._bar = None
            return None
        self._bar = Progress(
            TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        )
        self._bar.start()
        task = self._bar.add_task("rows", total=None)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
