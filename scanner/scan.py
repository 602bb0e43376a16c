"""Scan dataset files: judge every row, write the kept ones, account for every dropped one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa

from image_preflight.errors import InputError
from image_preflight.files.atomic import atomic_path
from image_preflight.scanner import datasets
from image_preflight.scanner.records import RowRecords
from image_preflight.scanner.judge import RowJudge, RowVerdict
from image_preflight.scanner.parquet_inputs import distinct_inputs

class Progress(Protocol):
    def advance(self, rows: int) -> None:
        """`rows` more rows judged."""

    def add_total(self, rows: int) -> None:
        """`rows` more rows to judge (a file's count, once it is known)."""


@dataclass(slots=True)
class FileResult:
    path: Path
    rows: int
    dropped: RowRecords
    unconfirmed: RowRecords  # kept under --keep-unknown though no list confirms their images
    output: Path | None = None
    # Kept rows lacking a field the Job prints only as text, by field (dotted path).
    lacking: Counter = field(default_factory=Counter)
    # The distinct RowVerdict.needed of the kept rows, the images they will ask the nodes for;
    # None unless scan(needed=True).
    needed: set[str] | None = None

    @property
    def kept(self) -> int:
        return self.rows - len(self.dropped)

    def dropped_by_reason(self) -> Counter:
        return self.dropped.by_reason()


@dataclass(slots=True)
class ScanResult:
    files: list[FileResult] = field(default_factory=list)
    renders: int = 0

    @property
    def dropped(self) -> int:
        return sum(len(f.dropped) for f in self.files)

    @property
    def unconfirmed(self) -> int:
        return sum(len(f.unconfirmed) for f in self.files)

    def missing_images(self) -> Counter:
        """Distinct missing images with the number of rows each one drops."""
        counts: Counter = Counter()
        for result in self.files:
            counts.update(result.dropped.missing_images())
        return counts

    def needed_images(self) -> set[str]:
        """The distinct images of the kept rows (image_key() of each), what --needed-images lists."""
        if any(result.needed is None for result in self.files):
            raise ValueError("the needed images are collected by scan(..., needed=True)")
        return set().union(*(result.needed for result in self.files))


def scan(
    paths: Sequence[Path],
    judge: RowJudge,
    *,
    out_dir: Path | None = None,
    progress: Progress | None = None,
    protect: Sequence[Path] = (),
    needed: bool = False,
) -> ScanResult:
    """`protect`: more files (template, snapshots) that an output must not replace. `needed`: also
    collect the images of the kept rows (ScanResult.needed_images)."""
    for path in paths:
        datasets.dataset_format(path)
    counted = set()
    if progress:
        for path in paths:
            rows = datasets.row_count_hint(path)
            if rows is not None:
                counted.add(path)
                progress.add_total(rows)
    outputs = datasets.output_paths(paths, out_dir, extra=protect) if out_dir is not None else [None] * len(paths)
    result = ScanResult()
    # Every output is staged and moved into place only once all inputs were read: an unreadable
    # later input leaves no output of an earlier one.
    try:
        with ExitStack() as staged:
            for path, output in zip(paths, outputs):
                stage = Path(staged.enter_context(atomic_path(output))) if output is not None else None
                file_result = scan_file(path, judge, output=stage, progress=progress, counted=path in counted,
                                        needed=needed)
                file_result.output = output
                result.files.append(file_result)
    except OSError as exc:  # inputs are read with their own errors; this is the out-dir
        raise InputError(f"{out_dir}: cannot write ({exc.strerror or exc})") from None
    result.renders = judge.renders
    return result


def scan_file(path: Path, judge: RowJudge, *, output: Path | None = None, progress: Progress | None = None,
              counted: bool = False, needed: bool = False) -> FileResult:
    """`counted`: the progress total already holds this file's rows. `needed`: fill FileResult.needed."""
    if datasets.dataset_format(path) == "parquet":
        return _scan_parquet(path, judge, output, progress, counted, needed)
    return _scan_json(path, judge, output, progress, counted, needed)


def _scan_json(path: Path, judge: RowJudge, output: Path | None, progress: Progress | None,
               counted: bool, needed: bool) -> FileResult:
    source = datasets.read_json_rows(path)
    if not source.rows:
        raise InputError(f"{path}: no rows")
    if progress and not counted:
        progress.add_total(len(source.rows))
    keep, lacking = [], Counter()
    dropped, unconfirmed = _Collected(), _Collected()
    kept_verdicts: dict[int, RowVerdict] | None = {} if needed else None  # by id: rows share verdicts
    for index, row in enumerate(source.rows):
        verdict = judge.judge(row)
        keep.append(verdict.kept)
        _account(index, verdict, dropped, unconfirmed, lacking, kept_verdicts)
        if progress and index % 1024 == 1023:
            progress.advance(1024)
    if progress:
        progress.advance(len(source.rows) % 1024)
    if output is not None:
        datasets.write_json_rows(output, source, keep)
    return FileResult(path, len(source.rows), dropped.records(path), unconfirmed.records(path), output, lacking,
                      _needed(kept_verdicts))


class _Collected:
    """Row numbers and their verdicts, gathered one row at a time."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.verdicts: list[RowVerdict] = []

    def add(self, row: int, verdict: RowVerdict) -> None:
        self.rows.append(row)
        self.verdicts.append(verdict)

    def records(self, path: Path) -> RowRecords:
        return RowRecords.collect(str(path), self.rows, self.verdicts)


def _account(index: int, verdict: RowVerdict, dropped: _Collected, unconfirmed: _Collected, lacking: Counter,
             kept_verdicts: dict[int, RowVerdict] | None) -> None:
    """One judged row into what the file's result counts."""
    if not verdict.kept:
        dropped.add(index, verdict)
        return
    if verdict.unconfirmed:
        unconfirmed.add(index, verdict)
    if kept_verdicts is not None:
        kept_verdicts[id(verdict)] = verdict
    if verdict.missing_fields:
        lacking.update(verdict.missing_fields)


def _scan_parquet(path: Path, judge: RowJudge, output: Path | None, progress: Progress | None,
                  counted: bool, needed: bool) -> FileResult:
    with datasets.open_parquet(path) as file:
        return _scan_parquet_file(path, file, judge, output, progress, counted, needed)


def _scan_parquet_file(path: Path, file, judge: RowJudge, output: Path | None, progress: Progress | None,
                       counted: bool, needed: bool) -> FileResult:
    rows = file.metadata.num_rows
    if rows == 0:
        raise InputError(f"{path}: no rows")
    if progress and not counted:
        progress.add_total(rows)
    inputs = _distinct_inputs(path, file, judge)
    verdicts, counted_rows = _shared_verdicts(judge, inputs, progress) if inputs is not None else ([None], 0)
    if None not in verdicts:
        keep_group = np.fromiter((v.kept for v in verdicts), dtype=bool, count=len(verdicts))
        keep = keep_group[inputs.group_of_row]
        dropped_at = np.flatnonzero(~keep)
        dropped = RowRecords(str(path), dropped_at, inputs.group_of_row[dropped_at], verdicts)
        unconfirmed_group = np.fromiter((v.unconfirmed for v in verdicts), dtype=bool, count=len(verdicts))
        unconfirmed_at = np.flatnonzero(unconfirmed_group[inputs.group_of_row])
        unconfirmed = RowRecords(str(path), unconfirmed_at, inputs.group_of_row[unconfirmed_at], verdicts)
        sizes = np.bincount(inputs.group_of_row, minlength=len(verdicts))
        lacking = Counter()
        for group, verdict in enumerate(verdicts):
            if verdict.kept and verdict.missing_fields:
                lacking.update({name: int(sizes[group]) for name in verdict.missing_fields})
        images = _needed({id(v): v for v, n in zip(verdicts, sizes) if v.kept and n} if needed else None)
        # Only the columns the template reads were read: the rest stream from the file to the output.
        batches, schema = datasets.parquet_batches(file, path), file.schema_arrow
    else:
        table = datasets.read_parquet(path)
        keep, dropped, unconfirmed, lacking, images = _judge_row_by_row(table, judge, path, progress, counted_rows,
                                                                        needed)
        batches, schema = table.to_batches(), table.schema
    if output is not None:
        datasets.write_parquet(output, batches, keep, schema=schema, like=path)
    return FileResult(path, rows, dropped, unconfirmed, output, lacking, images)


def _distinct_inputs(path: Path, file, judge: RowJudge):
    """The distinct inputs (parquet_inputs.distinct_inputs), reading only the columns they need."""
    if judge.value_paths is None:
        return None
    schema = file.schema_arrow
    heads = {p[0] for p in judge.value_paths} | {p[0] for p in judge.presence_paths if len(p) > 1}
    table = datasets.read_parquet(path, columns=[name for name in schema.names if name in heads])
    return distinct_inputs(table, judge.value_paths, judge.presence_paths, schema=schema)


def _shared_verdicts(judge: RowJudge, inputs, progress: Progress | None) -> tuple[list, int]:
    """One verdict per distinct input, and the rows reported to `progress` (the rows each verdict
    decides). A None verdict ends the list: the rows are then judged one by one."""
    sizes = np.bincount(inputs.group_of_row, minlength=len(inputs.rows)) if progress else None
    verdicts, done, reported = [], 0, 0
    for group, row in enumerate(inputs.rows):
        verdict = judge.shared_verdict(row)
        verdicts.append(verdict)
        if verdict is None:
            break
        if progress:
            done += int(sizes[group])  # type: ignore[index]
            if done >= 1024 or group == len(inputs.rows) - 1:
                progress.advance(done)
                reported, done = reported + done, 0
    return verdicts, reported


def _judge_row_by_row(table: pa.Table, judge: RowJudge, path: Path, progress: Progress | None = None,
                      reported: int = 0, needed: bool = False
                      ) -> tuple[np.ndarray, RowRecords, RowRecords, Counter, set | None]:
    """`reported`: rows already counted in `progress`, not to be counted twice."""
    paths = judge.template.paths
    if paths is not None:
        wanted = {p[0] for p in paths if isinstance(p[0], str)} & set(table.column_names)
        table = table.select([c for c in table.column_names if c in wanted])
    keep = np.ones(table.num_rows, dtype=bool)
    dropped, unconfirmed, lacking = _Collected(), _Collected(), Counter()
    kept_verdicts: dict[int, RowVerdict] | None = {} if needed else None  # by id: rows share verdicts
    offset = 0
    for batch in table.to_batches(max_chunksize=65536):
        for index, row in enumerate(batch.to_pylist(), start=offset):
            verdict = judge.judge(row)
            keep[index] = verdict.kept
            _account(index, verdict, dropped, unconfirmed, lacking, kept_verdicts)
        offset += batch.num_rows
        if progress:
            credit = min(reported, batch.num_rows)
            reported -= credit
            progress.advance(batch.num_rows - credit)
    return keep, dropped.records(path), unconfirmed.records(path), lacking, _needed(kept_verdicts)


def _needed(kept: dict[int, RowVerdict] | None) -> set[str] | None:
    """The images of the kept rows' distinct verdicts (by id), or None when not collected."""
    return None if kept is None else {key for verdict in kept.values() for key in verdict.needed}
