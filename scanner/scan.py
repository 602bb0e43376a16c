"""Scan dataset files: judge every row, write the kept ones, account for every dropped one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from image_preflight.errors import UsageError
from image_preflight.scanner import datasets
from image_preflight.scanner.dropped import DroppedRows
from image_preflight.scanner.judge import RowJudge
from image_preflight.scanner.parquet_inputs import distinct_inputs

Progress = Callable[[int], None]  # called with the number of rows just judged


@dataclass(slots=True)
class FileResult:
    path: Path
    rows: int
    dropped: DroppedRows
    output: Path | None = None
    # Kept rows lacking a field the Job prints only as text, by field (dotted path).
    lacking: Counter = field(default_factory=Counter)

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

    def missing_images(self) -> Counter:
        """Distinct missing images with the number of rows each one drops."""
        counts: Counter = Counter()
        for result in self.files:
            counts.update(result.dropped.missing_images())
        return counts


def scan(
    paths: Sequence[Path],
    judge: RowJudge,
    *,
    out_dir: Path | None = None,
    progress: Progress | None = None,
    protect: Sequence[Path] = (),
) -> ScanResult:
    """`protect`: more files (template, snapshots) that an output must not replace."""
    for path in paths:
        datasets.dataset_format(path)
    outputs = datasets.output_paths(paths, out_dir, extra=protect) if out_dir is not None else [None] * len(paths)
    result = ScanResult()
    # Every output is staged and moved into place only once all inputs were read: an unreadable
    # later input leaves no output of an earlier one.
    try:
        with ExitStack() as staged:
            for path, output in zip(paths, outputs):
                stage = Path(staged.enter_context(datasets.atomic_path(output))) if output is not None else None
                file_result = scan_file(path, judge, output=stage, progress=progress)
                file_result.output = output
                result.files.append(file_result)
    except OSError as exc:  # inputs are read with their own errors; this is the out-dir
        raise UsageError(f"{out_dir}: cannot write ({exc.strerror or exc})") from None
    result.renders = judge.renders
    return result


def scan_file(path: Path, judge: RowJudge, *, output: Path | None = None, progress: Progress | None = None) -> FileResult:
    if datasets.dataset_format(path) == "parquet":
        return _scan_parquet(path, judge, output, progress)
    return _scan_json(path, judge, output, progress)


def _scan_json(path: Path, judge: RowJudge, output: Path | None, progress: Progress | None) -> FileResult:
    source = datasets.read_json_rows(path)
    if not source.rows:
        raise UsageError(f"{path}: no rows")
    keep, dropped_rows, verdicts, lines, lacking = [], [], [], [], Counter()
    for index, row in enumerate(source.rows):
        verdict = judge.judge(row)
        keep.append(verdict.kept)
        if verdict.missing_fields and verdict.kept:
            lacking.update(verdict.missing_fields)
        if not verdict.kept:
            dropped_rows.append(index)
            verdicts.append(verdict)
            if source.line_numbers:
                lines.append(source.line_numbers[index])
        if progress and index % 1024 == 1023:
            progress(1024)
    if progress:
        progress(len(source.rows) % 1024)
    if output is not None:
        datasets.write_json_rows(output, source, keep)
    dropped = DroppedRows.collect(str(path), dropped_rows, verdicts, lines if source.line_numbers else None)
    return FileResult(path, len(source.rows), dropped, output, lacking)


def _scan_parquet(path: Path, judge: RowJudge, output: Path | None, progress: Progress | None) -> FileResult:
    table = datasets.read_parquet(path)
    if table.num_rows == 0:
        raise UsageError(f"{path}: no rows")
    inputs = distinct_inputs(table, judge.value_paths, judge.presence_paths)
    verdicts = [judge.shared_verdict(row) for row in inputs.rows] if inputs is not None else [None]
    if None not in verdicts:
        keep_group = np.fromiter((v.kept for v in verdicts), dtype=bool, count=len(verdicts))
        keep = keep_group[inputs.group_of_row]
        rows = np.flatnonzero(~keep)
        dropped = DroppedRows(str(path), rows, inputs.group_of_row[rows], verdicts)
        sizes = np.bincount(inputs.group_of_row, minlength=len(verdicts))
        lacking = Counter()
        for group, verdict in enumerate(verdicts):
            if verdict.kept and verdict.missing_fields:
                lacking.update({name: int(sizes[group]) for name in verdict.missing_fields})
    else:
        keep, dropped, lacking = _judge_row_by_row(table, judge, path)
    if progress:
        progress(table.num_rows)
    if output is not None:
        datasets.write_parquet(output, table, pa.array(keep, type=pa.bool_()), like=path)
    return FileResult(path, table.num_rows, dropped, output, lacking)


def _judge_row_by_row(table: pa.Table, judge: RowJudge, path: Path) -> tuple[np.ndarray, DroppedRows, Counter]:
    paths = judge.template.paths
    if paths is not None:
        wanted = {p[0] for p in paths if isinstance(p[0], str)} & set(table.column_names)
        table = table.select([c for c in table.column_names if c in wanted])
    keep = np.ones(table.num_rows, dtype=bool)
    dropped_rows, verdicts, lacking = [], [], Counter()
    offset = 0
    for batch in table.to_batches(max_chunksize=65536):
        for index, row in enumerate(batch.to_pylist(), start=offset):
            verdict = judge.judge(row)
            if verdict.kept and verdict.missing_fields:
                lacking.update(verdict.missing_fields)
            if not verdict.kept:
                keep[index] = False
                dropped_rows.append(index)
                verdicts.append(verdict)
        offset += batch.num_rows
    return keep, DroppedRows.collect(str(path), dropped_rows, verdicts), lacking
