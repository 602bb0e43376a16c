"""The dropped rows of one file, kept compact: a million rows share a few thousand verdicts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from image_preflight.scanner.judge import MISSING_IMAGE, RowVerdict


@dataclass(frozen=True, slots=True)
class DroppedRow:
    file: str
    row: int  # 0-based index among the file's rows
    line: int | None  # JSONL line number
    verdict: RowVerdict


class DroppedRows(Sequence):
    """A sequence of DroppedRow built on demand from row numbers and verdict codes."""

    def __init__(
        self,
        file: str,
        rows: np.ndarray,
        codes: np.ndarray,
        verdicts: list[RowVerdict],
        lines: Sequence[int] | None = None,
    ) -> None:
        self.file, self.rows, self.codes, self.verdicts, self.lines = file, rows, codes, verdicts, lines

    @classmethod
    def collect(cls, file: str, rows: list[int], verdicts: list[RowVerdict], lines: list[int] | None = None):
        """From one verdict per dropped row (JSON datasets)."""
        table: dict[int, int] = {}
        distinct: list[RowVerdict] = []
        codes = []
        for verdict in verdicts:
            code = table.get(id(verdict))
            if code is None:
                code = table[id(verdict)] = len(distinct)
                distinct.append(verdict)
            codes.append(code)
        return cls(file, np.asarray(rows, dtype=np.int64), np.asarray(codes, dtype=np.int64), distinct, lines)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        line = self.lines[index] if self.lines is not None else None
        return DroppedRow(self.file, int(self.rows[index]), line, self.verdicts[int(self.codes[index])])

    def __iter__(self) -> Iterator[DroppedRow]:
        return (self[i] for i in range(len(self)))

    def _per_verdict(self) -> np.ndarray:
        return np.bincount(self.codes, minlength=len(self.verdicts))

    def by_reason(self) -> Counter:
        counts: Counter = Counter()
        for verdict, rows in zip(self.verdicts, self._per_verdict()):
            counts[verdict.reason] += int(rows)
        return Counter({reason: n for reason, n in counts.items() if n})

    def count(self, matches) -> int:
        """Rows whose verdict `matches` (a predicate on RowVerdict)."""
        return sum(int(rows) for verdict, rows in zip(self.verdicts, self._per_verdict()) if matches(verdict))

    def missing_images(self) -> Counter:
        """Each missing image with the number of rows it drops."""
        counts: Counter = Counter()
        for verdict, rows in zip(self.verdicts, self._per_verdict()):
            if rows and verdict.reason == MISSING_IMAGE:
                for image in verdict.images:
                    counts[image] += int(rows)
        return counts
