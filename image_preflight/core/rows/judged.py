"""Rows to verdicts, one way: every row of a dataset judged (or each group of rows sharing their
template inputs, judged once), and what that gives: which rows stay, the dropped ones and those
kept unconfirmed with their verdicts, the fields kept rows lack, the images kept rows need. The
scan, the Python API (image_preflight.api) and agent_lightning.filter_datasets all judge rows here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from image_preflight.core.image_gc.pinning import needed_text
from image_preflight.core.rows.judge import RowJudge, RowVerdict
from image_preflight.core.rows.records import RowRecords


@dataclass(slots=True)
class JudgedRows:
    keep: np.ndarray  # one flag per row
    dropped: RowRecords
    unconfirmed: RowRecords  # kept under keep_unknown though no list confirms their images
    lacking: Counter[str]  # kept rows lacking a field the Job prints only as text, by field
    needed: set[str]  # the images the kept rows ask the nodes for (RowVerdict.needed)


def judged(file: str, verdicts: Sequence[RowVerdict], group_of_row: np.ndarray) -> JudgedRows:
    """What rows give whose verdicts are `verdicts[group_of_row[row]]`."""
    kept = np.fromiter((v.kept for v in verdicts), dtype=bool, count=len(verdicts))
    unconfirmed = np.fromiter((v.unconfirmed for v in verdicts), dtype=bool, count=len(verdicts))
    keep = kept[group_of_row]
    dropped_at = np.flatnonzero(~keep)
    unconfirmed_at = np.flatnonzero(unconfirmed[group_of_row])
    sizes = np.bincount(group_of_row, minlength=len(verdicts))
    lacking: Counter[str] = Counter()
    needed: set[str] = set()
    for verdict, rows in zip(verdicts, sizes):
        if rows and verdict.kept:
            lacking.update({name: int(rows) for name in verdict.missing_fields})
            needed.update(verdict.needed)
    return JudgedRows(keep, RowRecords(file, dropped_at, group_of_row[dropped_at], list(verdicts)),
                      RowRecords(file, unconfirmed_at, group_of_row[unconfirmed_at], list(verdicts)), lacking, needed)


class Progress(Protocol):
    def advance(self, rows: int) -> None:
        """`rows` more rows judged."""


class Groups:
    """Verdicts gathered row by row, rows sharing a verdict sharing its group."""

    def __init__(self, verdicts: Iterable[RowVerdict] = ()) -> None:
        self.verdicts: list[RowVerdict] = list(verdicts)
        self._code = {id(v): code for code, v in enumerate(self.verdicts)}

    def code(self, verdict: RowVerdict) -> int:
        code = self._code.get(id(verdict))
        if code is None:
            code = self._code[id(verdict)] = len(self.verdicts)
            self.verdicts.append(verdict)
        return code


def verdict_codes(rows: Iterable[Mapping[str, Any]], judge: RowJudge, groups: Groups, *,
                  progress: Progress | None = None) -> np.ndarray:
    """Each row's verdict, as its group in `groups`. `progress`: told every 1,024 rows."""
    codes = []
    for index, row in enumerate(rows):
        codes.append(groups.code(judge.judge(row)))
        if progress is not None and index % 1024 == 1023:
            progress.advance(1024)
    if progress is not None:
        progress.advance(len(codes) % 1024)
    return np.asarray(codes, dtype=np.int64)


def judge_each(rows: Iterable[Mapping[str, Any]], judge: RowJudge, file: str = "", *,
               progress: Progress | None = None) -> JudgedRows:
    """Every row judged on its own (rows with alike inputs still share the judge's work)."""
    groups = Groups()
    codes = verdict_codes(rows, judge, groups, progress=progress)
    return judged(file, groups.verdicts, codes)


@dataclass(frozen=True, slots=True)
class Filtered:
    """image_preflight.judge_rows' answer."""

    kept: list[Mapping[str, Any]]  # the rows whose rollout Job finds its images, in order
    dropped: list[tuple[int, Mapping[str, Any], RowVerdict]]  # (index from 0, row, why)
    unconfirmed: list[tuple[int, Mapping[str, Any], RowVerdict]]  # kept under keep_unknown, unconfirmed
    needed: list[str]  # the kept rows' images, as `scan --needed-images` writes them


def filtered(rows: Iterable[Mapping[str, Any]], judge: RowJudge) -> Filtered:
    """Every row judged by `judge`, and what stays of them: image_preflight.judge_rows' answer."""
    rows = rows if isinstance(rows, Sequence) else list(rows)
    result = judge_each(rows, judge)
    return Filtered(
        kept=[row for row, keep in zip(rows, result.keep) if keep],
        dropped=[(record.row, rows[record.row], record.verdict) for record in result.dropped],
        unconfirmed=[(record.row, rows[record.row], record.verdict) for record in result.unconfirmed],
        needed=needed_text(result.needed).splitlines(),
    )
