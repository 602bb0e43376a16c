"""Dataset files in and out: JSONL, JSON (a list of objects) and parquet.

Kept rows are written unchanged (JSONL lines verbatim, parquet with the identical schema),
atomically, and never over an input.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from image_preflight.core.objects import deeper_than, field_path
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
    """The rows of a JSONL or JSON file. InputError names the file and the line (JSONL) or row
    (JSON, counted from 0) that cannot be read, or holds a number that cannot be kept as written."""
    data = _read_bytes(path)
    if dataset_format(path) == "json":
        try:
            listed = _loads(data)
        except _Malformed as exc:
            raise InputError(f"{path}: not JSON ({exc})") from None
        except _Unkeepable as exc:
            failing = _failing_row(_text(data))
            raise InputError(f"{path}: {'' if failing is None else f'row {failing}: '}{exc}") from None
        if not isinstance(listed, list):
            raise InputError(f"{path}: expected a JSON list of objects, found {type(listed).__name__}")
        may_nest = _brackets(data) > MAX_DEPTH
        for index, row in enumerate(listed):
            if not isinstance(row, dict):
                raise InputError(f"{path}: row {index}: not a JSON object")
            too_deep = _too_deep(row) if may_nest else None
            if too_deep is not None:
                raise InputError(f"{path}: row {index}: {too_deep}: {_NESTED}")
        return JsonRows(listed, None)
    encoding = json.detect_encoding(data)
    if encoding not in ("utf-8", "utf-8-sig"):
        # Split at b"\n", another encoding's lines would be cut inside a character.
        raise InputError(f"{path}: JSON Lines are UTF-8 (jsonlines.org), this file is {encoding.upper()}")
    rows: list[dict] = []
    lines: list[bytes] = []
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.strip():
            continue
        try:
            row = _loads(line)
        except _Malformed as exc:
            raise InputError(f"{path}:{number}: malformed JSON line ({exc})") from None
        except _Unkeepable as exc:
            raise InputError(f"{path}:{number}: {exc}") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: not a JSON object")
        too_deep = _too_deep(row) if _brackets(line) > MAX_DEPTH else None
        if too_deep is not None:
            raise InputError(f"{path}:{number}: {too_deep}: {_NESTED}")
        rows.append(row)
        lines.append(line)
    return JsonRows(rows, lines)


class _Malformed(ValueError):
    """Not JSON, or not text: the reason, as the parser or the decoder says it."""


class _Unkeepable(ValueError):
    """JSON holding what Python cannot hold as written: the reason."""


def _finite(text: str) -> float:
    """A JSON number with a fraction or an exponent; one past a double's range (1e400) would be
    read as infinity and written back as Infinity, which is not JSON."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise _Unkeepable(f"the number {_clip(text)} is out of range for a double")
    return value


def _loads(data: bytes) -> object:
    """json.loads with every failure one of the two above. json.loads reads UTF-8, -16 and -32
    (with or without a BOM), as RFC 8259 8.1 lets a parser."""
    try:
        return json.loads(data, parse_float=_finite)
    except _Unkeepable:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _Malformed(_why(exc)) from None
    except ValueError:  # int()'s digit limit, which json.loads raises bare, without a position
        limit = sys.get_int_max_str_digits()
        found = next((m.group(1) for m in _long_integer(limit).finditer(_text(data)) if m.group(1)), "")
        raise _Unkeepable(f"an integer of {len(found)} digits (at most {limit})" if found
                          else f"an integer of more than {limit} digits") from None
    except RecursionError:
        raise _Unkeepable(_NESTED) from None


# A row nested deeper is refused as it is read: the judge converts and renders a row recursively
# (render.as_sent, str() of a value the template prints) against Python's limit of 1,000 frames,
# so that a row the parser still reads would overflow in the middle of the scan. The same bound
# as a review's (core/admission/body.py), and Arrow's parquet reader refuses a schema nested deeper.
MAX_DEPTH = 100
_NESTED = f"nested more than {MAX_DEPTH} levels deep"


def _brackets(data: bytes) -> int:
    """At least the depth of the JSON in `data` (every opening bracket counts, even in strings):
    only a text with more than MAX_DEPTH of them needs _too_deep's walk."""
    return data.count(b"[") + data.count(b"{")


def _too_deep(row: dict) -> str | None:
    """Where `row` holds an object or array more than MAX_DEPTH levels deep (the row is the
    first), such as extra.a[0]..., each key clipped, or None."""
    keys = deeper_than(row, MAX_DEPTH - 1)
    return None if keys is None else field_path(keys, 4, lambda key: _clip(repr(key)[1:-1]))


def _long_integer(limit: int) -> re.Pattern:
    """A JSON string (skipped) or an integer of more than `limit` digits (its digits, group 1)."""
    return re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w.+-])-?([0-9]{%d,})' % (limit + 1))


def _text(data: bytes) -> str:
    """`data` decoded as json.loads decodes it."""
    return data.decode(json.detect_encoding(data), "surrogatepass")


_SPACE = re.compile(r"[ \t\n\r]*")


def _failing_row(text: str) -> int | None:
    """The index of the first element of the JSON list `text` that cannot be read, None when
    `text` is no list or its elements are read (the failure is elsewhere)."""
    decoder = json.JSONDecoder(parse_float=_finite)
    index = _after_space(text, 0)
    if not text.startswith("[", index):
        return None
    index, row = _after_space(text, index + 1), 0
    while True:
        try:
            _, index = decoder.raw_decode(text, index)
        except (ValueError, RecursionError):
            return row
        index = _after_space(text, index)
        if not text.startswith(",", index):
            return None
        index, row = _after_space(text, index + 1), row + 1


def _after_space(text: str, index: int) -> int:
    """Where the JSON whitespace at `index` ends."""
    found = _SPACE.match(text, index)
    return found.end() if found else index  # it matches, if only the empty string


def _clip(text: str, keep: int = 40) -> str:
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


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
    """The file's rows (only `columns`, when given); InputError names a value Python cannot hold."""
    try:
        table = pq.read_table(path, columns=columns)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None
    for name, column in zip(table.column_names, table.columns):
        if not _plain(column.type):
            _check_values(path, name, column)
    return table


def _plain(type_: pa.DataType) -> bool:
    """Whether Python holds every value of `type_`: booleans, numbers, text and bytes, and lists,
    structs and maps of them. Not dates, times and durations: a date32 reaches 5.8 million years,
    a timestamp[s] 292 billion, datetime 9999."""
    if pa.types.is_dictionary(type_):
        return _plain(type_.value_type)
    if pa.types.is_struct(type_):
        return all(_plain(type_.field(i).type) for i in range(type_.num_fields))
    if pa.types.is_map(type_):
        return _plain(type_.key_type) and _plain(type_.item_type)
    if isinstance(type_, (pa.ListType, pa.LargeListType, pa.FixedSizeListType)):
        return _plain(type_.value_type)
    return (pa.types.is_null(type_) or pa.types.is_boolean(type_) or pa.types.is_integer(type_)
            or pa.types.is_floating(type_) or pa.types.is_decimal(type_) or pa.types.is_string(type_)
            or pa.types.is_large_string(type_) or pa.types.is_binary(type_) or pa.types.is_large_binary(type_)
            or pa.types.is_fixed_size_binary(type_))


def _check_values(path: Path, name: str, column: pa.ChunkedArray) -> None:
    """Every value of `column` turned into Python once, a batch at a time; InputError names the
    first row (from 0) that cannot be, such as a date past the year 9999."""
    for start in range(0, len(column), BATCH_ROWS):
        try:
            column.slice(start, BATCH_ROWS).to_pylist()
            continue
        except (ValueError, OverflowError, pa.ArrowException):
            pass
        for row in range(start, min(start + BATCH_ROWS, len(column))):
            try:
                column.slice(row, 1).to_pylist()
            except (ValueError, OverflowError, pa.ArrowException) as exc:
                raise InputError(f"{path}: row {row}: column {name!r} ({column.type}): a value past what Python "
                                 f"holds ({_why(exc)})") from None


def parquet_batches(file: pq.ParquetFile, path: Path) -> Iterator[pa.RecordBatch]:
    """Every row of `file`, a batch at a time: only a batch and what the writer holds are in memory."""
    try:
        yield from file.iter_batches(batch_size=BATCH_ROWS)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: BaseException) -> InputError:
    return InputError(f"{path}: not a readable parquet file ({_why(exc)})")


def write_json_rows(path: Path, source: JsonRows, keep: Iterable[bool]) -> None:
    if source.lines is not None:
        kept = [line for line, ok in zip(source.lines, keep) if ok]
        payload = b"".join(line if line.endswith((b"\n", b"\r")) else line + b"\n" for line in kept)
    else:
        kept_rows = [row for row, ok in zip(source.rows, keep) if ok]
        try:
            payload = (json.dumps(kept_rows, ensure_ascii=False, indent=2) + "\n").encode()
        except UnicodeEncodeError:
            # A lone surrogate, read from its escape: escaped again, as read, since UTF-8 has no
            # form for it.
            payload = (json.dumps(kept_rows, indent=2) + "\n").encode()
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

