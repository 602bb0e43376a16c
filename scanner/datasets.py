"""Dataset files in and out: JSONL, JSON (a list of objects) and parquet.

Kept rows are written unchanged (JSONL lines verbatim, parquet with the identical schema),
atomically, and never over an input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from image_preflight.errors import InputError
from image_preflight.files.atomic import atomic_path, write_atomic

BATCH_ROWS = 16384  # parquet rows read at a time
# Kept rows are written in row groups of about this much Arrow data, as Spark's parquet.block.size.
ROW_GROUP_BYTES = 128 << 20
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}


def dataset_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"{path}: unknown dataset format (expected .jsonl, .json or .parquet)")
    return fmt


@dataclass(slots=True)
class JsonRows:
    """Rows of a JSONL or JSON file; `lines` holds each JSONL row's original text."""

    rows: list[dict]
    lines: list[bytes] | None  # JSONL only, each with its own line ending


def read_json_rows(path: Path) -> JsonRows:
    data = _read_bytes(path)
    if dataset_format(path) == "json":
        try:
            rows = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: not JSON ({_why(exc)})") from None
        if not isinstance(rows, list):
            raise InputError(f"{path}: expected a JSON list of objects, found {type(rows).__name__}")
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise InputError(f"{path}: row {index}: not a JSON object")
        return JsonRows(rows, None)
    rows, lines = [], []
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}:{number}: malformed JSON line ({_why(exc)})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: not a JSON object")
        rows.append(row)
        lines.append(line)
    return JsonRows(rows, lines)


def row_count_hint(path: Path) -> int | None:
    """A parquet file's row count from its footer; None for JSON (known once read) or when the
    footer cannot be read (the read itself will say why)."""
    if dataset_format(path) != "parquet":
        return None
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError):
        return None


def open_parquet(path: Path) -> pq.ParquetFile:
    """The file's footer read; its rows are read as they are asked for."""
    try:
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None


def read_parquet(path: Path, columns: Sequence[str] | None = None) -> pa.Table:
    try:
        return pq.read_table(path, columns=columns)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None


def parquet_batches(file: pq.ParquetFile, path: Path) -> Iterator[pa.RecordBatch]:
    """Every row of `file`, a batch at a time: only a batch and what the writer holds are in memory."""
    try:
        yield from file.iter_batches(batch_size=BATCH_ROWS)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: BaseException) -> InputError:
    return InputError(f"{path}: not a readable parquet file ({_why(exc)})")


def write_json_rows(path: Path, source: JsonRows, keep: Sequence[bool]) -> None:
    if source.lines is not None:
        kept = [line for line, ok in zip(source.lines, keep) if ok]
        payload = b"".join(line if line.endswith((b"\n", b"\r")) else line + b"\n" for line in kept)
    else:
        kept_rows = [row for row, ok in zip(source.rows, keep) if ok]
        payload = (json.dumps(kept_rows, ensure_ascii=False, indent=2) + "\n").encode()
    write_atomic(path, payload)


def write_parquet(path: Path, batches: Iterable[pa.RecordBatch], keep: np.ndarray, *, schema: pa.Schema,
                  like: Path) -> None:
    """The rows of `batches` that `keep` (one flag per row) marks, in row groups of about
    ROW_GROUP_BYTES, with the compression of `like`."""
    # Not "compliant": list items keep the name the input gave them ("item" from older writers).
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema, compression=_compression_of(like),
                                                     use_compliant_nested_type=False) as writer:
        pending, size, offset = [], 0, 0
        for batch in batches:
            mask = keep[offset:offset + batch.num_rows]
            offset += batch.num_rows
            kept = batch if mask.all() else batch.filter(pa.array(mask, type=pa.bool_()))
            if kept.num_rows:
                pending.append(kept)
                size += kept.nbytes
            if size >= ROW_GROUP_BYTES:
                writer.write_table(pa.Table.from_batches(pending, schema))
                pending, size = [], 0
        if pending:
            writer.write_table(pa.Table.from_batches(pending, schema))


def _compression_of(path: Path) -> str:
    try:
        meta = pq.ParquetFile(path).metadata
        if meta.num_row_groups and meta.num_columns:
            codec = meta.row_group(0).column(0).compression
            return "none" if codec == "UNCOMPRESSED" else codec.lower()
    except (pa.ArrowException, OSError):
        pass
    return "snappy"


def output_paths(inputs: Sequence[Path], out_dir: Path, *, extra: Sequence[Path] = ()) -> list[Path]:
    """Where each input's kept rows go; refuses to write over any input or twice to one file."""
    outputs = [out_dir / p.name for p in inputs]
    protected = {file_identity(p) for p in [*inputs, *extra]}
    seen: set = set()
    for source, target in zip(inputs, outputs):
        ident = file_identity(target)
        if ident in protected:
            raise InputError(f"{target}: would overwrite an input; choose another --out-dir")
        if ident in seen:
            raise InputError(f"{source}: another input has the same file name {source.name!r} for {out_dir}")
        seen.add(ident)
    return outputs


def refuse_overwrite(target: Path, protected: Sequence[Path], option: str) -> None:
    """InputError when `target` is one of the `protected` files (inputs are never written)."""
    if file_identity(target) in {file_identity(p) for p in protected}:
        raise InputError(f"{target}: {option} would overwrite an input")


def file_identity(path: Path) -> object:
    try:
        stat = path.stat()
        return (stat.st_dev, stat.st_ino)
    except OSError:
        return os.path.abspath(path)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({_why(exc)})") from None


def _why(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc)
    return " ".join(text.split())[:200]

