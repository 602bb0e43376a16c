"""Rows to verdicts, one way: every row of a dataset judged (or each group of rows sharing their
template inputs, judged once), and what that gives: which rows stay, the dropped ones and those
kept unconfirmed with their verdicts, the fields kept rows lack, the images kept rows need. The
scan, the Python API and agent_lightning.filter_datasets all judge rows here.
"""

from __future__ import annotations

import inspect
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from image_preflight.core.decide.decision import REQUIRE_ALL
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.image_gc.pinning import needed_text
from image_preflight.scanner.judge import RowJudge, RowVerdict, make_template
from image_preflight.scanner.records import RowRecords


@dataclass(slots=True)
class JudgedRows:
    keep: np.ndarray  # one flag per row
    dropped: RowRecords
    unconfirmed: RowRecords  # kept under keep_unknown though no list confirms their images
    lacking: Counter  # kept rows lacking a field the Job prints only as text, by field
    needed: set[str]  # the images the kept rows ask the nodes for (RowVerdict.needed)


def judged(file: str, verdicts: Sequence[RowVerdict], group_of_row: np.ndarray) -> JudgedRows:
    """What rows give whose verdicts are `verdicts[group_of_row[row]]`."""
    kept = np.fromiter((v.kept for v in verdicts), dtype=bool, count=len(verdicts))
    unconfirmed = np.fromiter((v.unconfirmed for v in verdicts), dtype=bool, count=len(verdicts))
    keep = kept[group_of_row]
    dropped_at = np.flatnonzero(~keep)
    unconfirmed_at = np.flatnonzero(unconfirmed[group_of_row])
    sizes = np.bincount(group_of_row, minlength=len(verdicts))
    lacking: Counter = Counter()
    needed: set[str] = set()
    for verdict, rows in zip(verdicts, sizes):
        if rows and verdict.kept:
            lacking.update({name: int(rows) for name in verdict.missing_fields})
            needed.update(verdict.needed)
    return JudgedRows(keep, RowRecords(file, dropped_at, group_of_row[dropped_at], list(verdicts)),
                      RowRecords(file, unconfirmed_at, group_of_row[unconfirmed_at], list(verdicts)), lacking, needed)


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


def verdict_codes(rows: Iterable[Mapping], judge: RowJudge, groups: Groups, *, progress=None) -> np.ndarray:
    """Each row's verdict, as its group in `groups`. `progress`: told every 1,024 rows (scan.Progress)."""
    codes = []
    for index, row in enumerate(rows):
        codes.append(groups.code(judge.judge(row)))
        if progress is not None and index % 1024 == 1023:
            progress.advance(1024)
    if progress is not None:
        progress.advance(len(codes) % 1024)
    return np.asarray(codes, dtype=np.int64)


def judge_each(rows: Iterable[Mapping], judge: RowJudge, file: str = "", *, progress=None) -> JudgedRows:
    """Every row judged on its own (rows with alike inputs still share the judge's work)."""
    groups = Groups()
    codes = verdict_codes(rows, judge, groups, progress=progress)
    return judged(file, groups.verdicts, codes)


@dataclass(frozen=True, slots=True)
class Filtered:
    """judge_rows' answer."""

    kept: list[Mapping]  # the rows whose rollout Job finds its images, in order
    dropped: list[tuple[int, Mapping, RowVerdict]]  # (index from 0, row, why)
    unconfirmed: list[tuple[int, Mapping, RowVerdict]]  # kept under keep_unknown, unconfirmed
    needed: list[str]  # the kept rows' images, as `scan --needed-images` writes them


def judge_rows(rows: Iterable[Mapping], *, template: str | None = None, image: str | None = None,
               inventory: Inventory, require: str = REQUIRE_ALL, keep_unknown: bool = False,
               now: float | None = None) -> Filtered:
    """Render the rollout Job for every row, as agent-lightning renders it, and judge its images
    against `inventory`: the kept rows, the dropped ones with their verdicts (and with `keep_unknown`
    those kept unconfirmed), and the images the kept rows need, in one pass.

    `template` is the Job template text, or `image` a one-container shortcut such as
    '{{ input.image_name }}:openai'. `require`: "all" (every eligible node holds the images), "any"
    or "one-node". Leases of the node agents' lists are judged at `now` (default: the current time).
    Raises TemplateError (a ValueError) when the template cannot yield a Job at all."""
    job_template = make_template(template, image)
    job_template.check()
    judge = RowJudge(job_template, inventory, require=require, keep_unknown=keep_unknown,
                     now=time.time() if now is None else now)
    rows = rows if isinstance(rows, Sequence) else list(rows)
    result = judge_each(rows, judge)
    return Filtered(
        kept=[row for row, keep in zip(rows, result.keep) if keep],
        dropped=[(record.row, rows[record.row], record.verdict) for record in result.dropped],
        unconfirmed=[(record.row, rows[record.row], record.verdict) for record in result.unconfirmed],
        needed=needed_text(result.needed).splitlines(),
    )


def filter_rows(rows: Iterable[Mapping], **rules) -> tuple[list[Mapping], list[tuple[int, Mapping, RowVerdict]]]:
    """judge_rows(rows, **rules)'s kept rows and [(index, row, RowVerdict), ...], each index
    counted from 0 as `image-preflight scan` numbers rows."""
    result = judge_rows(rows, **rules)
    return result.kept, result.dropped


def needed_images(rows: Iterable[Mapping], **rules) -> list[str]:
    """judge_rows(rows, **rules)'s needed list: the IfNotPresent/Never images of the kept rows'
    Jobs, each as the runtime names it ('docker.io/library/foo:openai'), sorted: the lines of
    `image-preflight scan --needed-images`, for the node agent to pin (docs/agent.md)."""
    return judge_rows(rows, **rules).needed


# help() shows judge_rows' keywords on its two views: they are defined once, there.
for _view, _returns in ((filter_rows, "tuple[list[Mapping], list[tuple[int, Mapping, RowVerdict]]]"),
                        (needed_images, "list[str]")):
    setattr(_view, "__signature__", inspect.signature(judge_rows).replace(return_annotation=_returns))
del _view, _returns
