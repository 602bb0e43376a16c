"""`image-preflight scan`: drop the dataset rows whose rollout Job would wait for an absent image.

The runner: scanner/config.py holds the flags and the config they map onto."""

from __future__ import annotations

import shutil
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from image_preflight.core.rows.judge import RowJudge, make_template
from image_preflight.core.sources.snapshots import load_document
from image_preflight.errors import InputError, UsageError
from image_preflight.files.atomic import atomic_path
from image_preflight.files.inventory import load_inventory_file
from image_preflight.image_set import compact_inventory
from image_preflight.scanner import datasets, output
from image_preflight.scanner.config import ScanConfig
from image_preflight.scanner.scan import scan


def run(config: ScanConfig) -> int:
    now = time.time()
    inventory = (load_inventory_file(list(config.inventory), max_images=config.max_images) if config.inventory
                 else _cluster_inventory(config, now))
    judge = RowJudge(_template(config), inventory, require=config.rule, keep_unknown=config.keep_unknown, now=now)
    other_inputs = config.inputs
    outputs = (("--report", config.report), ("--missing-images", config.missing_images),
               ("--needed-images", config.needed_images))
    for option, target in outputs:
        if target is not None:
            datasets.refuse_overwrite(target, [*config.datasets, *other_inputs], option)
    _refuse_one_file_twice(outputs, config)
    created = _make_out_dir(config.out_dir)
    try:
        # Every output is staged before the first row is judged: one that cannot be written stops
        # the scan with nothing written, and none is in place until all are complete.
        with ExitStack() as staged:
            report = staged.enter_context(atomic_path(config.report)) if config.report else None
            missing = staged.enter_context(atomic_path(config.missing_images)) if config.missing_images else None
            needed = staged.enter_context(atomic_path(config.needed_images)) if config.needed_images else None
            with _progress() as progress:
                result = scan(list(config.datasets), judge, out_dir=config.out_dir, progress=progress,
                              protect=other_inputs)
            if report is not None:
                Path(report).write_text(output.report_text(result), encoding="utf-8")
            if missing is not None:
                Path(missing).write_text(output.missing_images_text(result), encoding="utf-8")
            if needed is not None:
                Path(needed).write_text(output.needed_images_text(result), encoding="utf-8")
    except BaseException:
        if created is not None and config.out_dir is not None:  # created: the out dir's topmost new folder
            _remove_empty(created, config.out_dir)
        raise
    if config.output == "json":
        sys.stdout.write(output.report_text(result))
    else:
        # A table on a terminal; piped, one record a line for grep and scripts.
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        output.write_lines(output.summary_lines(result, inventory, width=width), sys.stdout)
    return 1 if config.fail_on_drop and result.dropped else 0


def _refuse_one_file_twice(outputs: tuple[tuple[str, Path | None], ...], config: ScanConfig) -> None:
    """UsageError when two outputs (options, or an option and a file of --out-dir) name one file
    (as datasets.output_paths and refuse_overwrite tell files apart)."""
    written: dict[object, str] = {}
    for option, target in outputs:
        if target is None:
            continue
        other = written.setdefault(datasets.file_identity(target), option)
        if other != option:
            raise UsageError(f"{target}: {other} and {option} would write the same file")
    if config.out_dir is None:
        return
    for path in config.datasets:
        written_by = written.get(datasets.file_identity(config.out_dir / path.name))
        if written_by is not None:
            raise UsageError(f"{config.out_dir / path.name}: {written_by} and --out-dir would write the same file")


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


def _cluster_inventory(config: ScanConfig, now: float):
    try:
        from image_preflight.kube.cluster_inventory import read_cluster
    except ImportError:
        raise UsageError("reading the cluster needs the Kubernetes client: pip install 'image-preflight[kube]', "
                         "or give --inventory") from None
    api = config.cluster.client()
    try:
        document = read_cluster(api, now=now, note=lambda text: print(f"image-preflight scan: {text}", file=sys.stderr),
                                agent_namespace=config.cluster.agent_namespace)
    finally:
        api.close()
    inventory = load_document(document, source="the cluster", observed_at=now, max_images=config.max_images)
    return compact_inventory(inventory)


def _template(config: ScanConfig):
    """The Job template; TemplateError (an InputError) when it cannot yield a Job at all."""
    if config.template is None:  # --image: one of the two (ScanConfig)
        template = make_template(None, config.image)
    else:
        try:
            text = config.template.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{config.template}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
        template = make_template(text, None, name=str(config.template))
    template.check()
    return template


class _progress:
    """A rich progress bar on stderr with the rows judged, their total as known so far and an ETA;
    only when stderr is a terminal."""

    def __enter__(self):
        if not sys.stderr.isatty():
            self._bar = None
            return None
        # Imported for a terminal only: some 35 ms of a piped scan's start-up.
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("scanning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
            console=Console(stderr=True), transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("rows", total=0)
        return self

    def advance(self, rows: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, rows)

    def add_total(self, rows: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, total=(self._bar.tasks[0].total or 0) + rows)  # total 0 at first

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
