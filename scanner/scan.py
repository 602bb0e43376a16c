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

from image_preflight.core.rows.judge import RowJudge, RowReason, RowVerdict
from image_preflight.core.rows.judged import Groups, JudgedRows, judge_each, judged, verdict_codes
from image_preflight.core.rows.records import RowRecords
from image_preflight.errors import InputError
from image_preflight.files.atomic import atomic_path
from image_preflight.scanner import datasets
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
    judged: JudgedRows
    output: Path | None = None

    @property
    def dropped(self) -> RowRecords:
        return self.judged.dropped

    @property
    def unconfirmed(self) -> RowRecords:
        """Kept under --keep-unknown though no list confirms their images."""
        return self.judged.unconfirmed

    @property
    def lacking(self) -> Counter:
        """Kept rows lacking a field the Job prints only as text, by field (dotted path)."""
        return self.judged.lacking

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
        return set().union(*(result.judged.needed for result in self.files))


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
                file_result = scan_file(path, judge, output=stage, progress=progress, counted=path in counted)
                file_result.output = output
                result.files.append(file_result)
    except OSError as exc:  # inputs are read with their own errors; this is the out-dir
        raise InputError(f"{out_dir}: cannot write ({exc.strerror or exc})") from None
    result.renders = judge.renders
    return result


def scan_file(path: Path, judge: RowJudge, *, output: Path | None = None, progress: Progress | None = None,
              counted: bool = False) -> FileResult:
    """`counted`: the progress total already holds this file's rows."""
    if datasets.dataset_format(path) == "parquet":
        with datasets.open_parquet(path) as file:
            return _scan_parquet(path, file, judge, output, progress, counted)
    return _scan_json(path, judge, output, progress, counted)


def _scan_json(path: Path, judge: RowJudge, output: Path | None, progress: Progress | None,
               counted: bool) -> FileResult:
    source = datasets.read_json_rows(path)
    if not source.rows:
        raise InputError(f"{path}: no rows")
    if progress and not counted:
        progress.add_total(len(source.rows))
    result = judge_each(source.rows, judge, str(path), progress=progress)
    if output is not None:
        datasets.write_json_rows(output, source, result.keep)
    return FileResult(path, len(source.rows), result, output)


def _scan_parquet(path: Path, file, judge: RowJudge, output: Path | None, progress: Progress | None,
                  counted: bool) -> FileResult:
    rows = file.metadata.num_rows
    if rows == 0:
        raise InputError(f"{path}: no rows")
    if progress and not counted:
        progress.add_total(rows)
    result = _judge_parquet(path, file, judge, progress)
    if output is not None:
        # Only the columns the template reads were read: every row streams from the file to the output.
        datasets.write_parquet(output, datasets.parquet_batches(file, path), result.keep, schema=file.schema_arrow,
                               like=path)
    return FileResult(path, rows, result, output)


def _judge_parquet(path: Path, file, judge: RowJudge, progress: Progress | None) -> JudgedRows:
    """Rows grouped by the inputs their verdict depends on, read column-wise, each group judged once;
    the rows of a group without a shared verdict (all rows, when the inputs cannot be grouped) are
    then judged one by one from the columns the template reads: no row is judged twice."""
    rows = file.metadata.num_rows
    inputs = _distinct_inputs(path, file, judge)
    if inputs is None:
        groups, group_of_row, alone = Groups(), np.zeros(rows, dtype=np.int64), np.arange(rows)
    else:
        verdicts = _shared_verdicts(judge, inputs, progress)
        pending = [group for group, verdict in enumerate(verdicts) if verdict is None]
        # A group without a shared verdict keeps a stand-in until its rows are judged.
        groups = Groups(verdict or _UNJUDGED for verdict in verdicts)
        group_of_row = inputs.group_of_row.copy()
        alone = np.flatnonzero(np.isin(group_of_row, pending)) if pending else np.empty(0, dtype=np.int64)
    if len(alone):
        table = _template_columns(path, file, judge)
        if len(alone) < rows:
            table = table.take(pa.array(alone))
        batches = table.to_batches(max_chunksize=65536)
        group_of_row[alone] = verdict_codes((row for batch in batches for row in batch.to_pylist()), judge, groups,
                                            progress=progress)
    return judged(str(path), groups.verdicts, group_of_row)


def _shared_verdicts(judge: RowJudge, inputs, progress: Progress | None) -> list[RowVerdict | None]:
    """One verdict per distinct input (None: its rows need one each), the rows each decides told to
    `progress` about every 1,024."""
    sizes = np.bincount(inputs.group_of_row, minlength=len(inputs.rows)) if progress else None
    verdicts, done = [], 0
    for group, row in enumerate(inputs.rows):
        verdict = judge.shared_verdict(row)
        verdicts.append(verdict)
        if progress and sizes is not None and verdict is not None:  # sizes: counted for a progress
            done += int(sizes[group])
            if done >= 1024:
                progress.advance(done)
                done = 0
    if progress and done:
        progress.advance(done)
    return verdicts


# Stands for the groups judged row by row: no row keeps it, so it counts nowhere.
_UNJUDGED = RowVerdict(RowReason.UNRENDERABLE, detail="judged row by row")


def _distinct_inputs(path: Path, file, judge: RowJudge):
    """The distinct inputs (parquet_inputs.distinct_inputs), reading only the columns they need."""
    if judge.value_paths is None:
        return None
    schema = file.schema_arrow
    heads = {p[0] for p in judge.value_paths} | {p[0] for p in judge.presence_paths if len(p) > 1}
    table = datasets.read_parquet(path, columns=[name for name in schema.names if name in heads])
    return distinct_inputs(table, judge.value_paths, judge.presence_paths, schema=schema)


def _template_columns(path: Path, file, judge: RowJudge) -> pa.Table:
    """The columns the template reads (all of them when that is not known)."""
    paths = judge.template.paths
    if paths is None:
        return datasets.read_parquet(path)
    wanted = {p[0] for p in paths if isinstance(p[0], str)}
    return datasets.read_parquet(path, columns=[name for name in file.schema_arrow.names if name in wanted])
