"""Rows of one file with their verdicts (the dropped ones, the ones kept unconfirmed), kept compact:
a million rows share a few thousand verdicts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from image_preflight.core.decide.inventory import image_key
from image_preflight.core.rows.judge import MISSING_IMAGE, RowReason, RowVerdict


@dataclass(frozen=True, slots=True)
class RowRecord:
    file: str
    row: int  # 0-based index among the file's rows, in every format
    verdict: RowVerdict


class RowRecords(Sequence[RowRecord]):
    """A sequence of RowRecord built on demand from row numbers and verdict codes."""

    def __init__(
        self,
        file: str,
        rows: np.ndarray,
        codes: np.ndarray,
        verdicts: list[RowVerdict],
    ) -> None:
        self.file, self.rows, self.codes, self.verdicts = file, rows, codes, verdicts

    @classmethod
    def collect(cls, file: str, rows: list[int], verdicts: list[RowVerdict]) -> RowRecords:
        """From one verdict per row."""
        table: dict[int, int] = {}
        distinct: list[RowVerdict] = []
        codes = []
        for verdict in verdicts:
            code = table.get(id(verdict))
            if code is None:
                code = table[id(verdict)] = len(distinct)
                distinct.append(verdict)
            codes.append(code)
        return cls(file, np.asarray(rows, dtype=np.int64), np.asarray(codes, dtype=np.int64), distinct)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> RowRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[RowRecord]: ...
    def __getitem__(self, index: int | slice) -> RowRecord | list[RowRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return RowRecord(self.file, int(self.rows[index]), self.verdicts[int(self.codes[index])])

    def __iter__(self) -> Iterator[RowRecord]:
        return (self[i] for i in range(len(self)))

    def _per_verdict(self) -> np.ndarray:
        return np.bincount(self.codes, minlength=len(self.verdicts))

    def by_reason(self) -> Counter[RowReason]:
        counts: Counter[RowReason] = Counter()
        for verdict, rows in zip(self.verdicts, self._per_verdict()):
            counts[verdict.reason] += int(rows)
        return Counter({reason: n for reason, n in counts.items() if n})

    def count(self, matches: Callable[[RowVerdict], object]) -> int:
        """Rows whose verdict `matches` (a predicate on RowVerdict)."""
        return sum(int(rows) for verdict, rows in zip(self.verdicts, self._per_verdict()) if matches(verdict))

    def missing_images(self) -> Counter[str]:
        """Each missing image, as the runtime names it (image_key), with the number of rows it drops."""
        counts: Counter[str] = Counter()
        for verdict, rows in zip(self.verdicts, self._per_verdict()):
            if rows and verdict.reason == MISSING_IMAGE:
                for key in dict.fromkeys(image_key(image) for image in verdict.images):
                    counts[key] += int(rows)
        return counts
