"""Rows of one file with their verdicts (the dropped ones, the ones kept unconfirmed), kept compact:
a million rows share a few thousand verdicts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from image_preflight.core.decide.inventory import image_key
from image_preflight.scanner.judge import MISSING_IMAGE, RowVerdict


@dataclass(frozen=True, slots=True)
class RowRecord:
    file: str
    row: int  # 0-based index among the file's rows, in every format
    verdict: RowVerdict


class RowRecords(Sequence):
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
    def collect(cls, file: str, rows: list[int], verdicts: list[RowVerdict]):
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

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return RowRecord(self.file, int(self.rows[index]), self.verdicts[int(self.codes[index])])

    def __iter__(self) -> Iterator[RowRecord]:
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
        """Each missing image, as the runtime names it (image_key), with the number of rows it drops."""
        counts: Counter = Counter()
        for verdict, rows in zip(self.verdicts, self._per_verdict()):
            if rows and verdict.reason == MISSING_IMAGE:
                for key in dict.fromkeys(image_key(image) for image in verdict.images):
                    counts[key] += int(rows)
        return counts
