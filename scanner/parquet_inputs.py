"""The distinct template inputs of a parquet table, found column-wise.

A million rows usually hold a few thousand distinct images: dictionary-encoding the columns the
template reads finds them without turning every row into Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_ABSENT = object()  # the column or struct field does not exist: the field is missing in every row


@dataclass(slots=True)
class DistinctInputs:
    rows: list[dict]  # one row per distinct combination, holding only the fields the template reads
    group_of_row: np.ndarray  # for each table row, its index into `rows`


def distinct_inputs(
    table: pa.Table,
    paths: tuple[tuple[str | int, ...], ...] | None,
    present: tuple[tuple[str | int, ...], ...] = (),
    *,
    schema: pa.Schema | None = None,
) -> DistinctInputs | None:
    """Rows grouped by their values at `paths`; `present` paths only need to be there or not,
    which is the same for every row of a column (they get an empty string as placeholder).
    None when the paths cannot be followed column-wise (the caller goes row by row).

    `schema`: the file's, when `table` holds only the columns `paths` start at and those of
    nested `present` paths; a top-level column's presence is told by its type alone."""
    if paths is None:
        return None
    placeholders = []
    for path in present:
        column = _column(table, path) if schema is None or len(path) > 1 else _column_type(schema, path)
        if column is None:
            return None
        if column is not _ABSENT:
            placeholders.append(path)
    columns = []
    for path in paths:
        column = _column(table, path)
        if column is None:
            return None
        columns.append(column)
    n = table.num_rows
    codes = np.zeros(n, dtype=np.int64)
    decoders = []  # (path, per-row dictionary index, dictionary values)
    for path, column in zip(paths, columns):
        if column is _ABSENT:
            continue
        try:
            array = column.combine_chunks()
            if pa.types.is_dictionary(array.type):
                array = array.dictionary_decode()  # re-encoding a dictionary would leave its nulls unencoded
            encoded = pc.dictionary_encode(array, null_encoding="encode")
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # e.g. over 2 GiB of strings: go row by row
            return None
        indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        values = encoded.dictionary.to_pylist()
        if int(codes.max(initial=0)) * max(len(values), 1) >= 2**62:  # int(): no int64 wraparound
            codes = np.unique(codes, return_inverse=True)[1].astype(np.int64)  # re-compact before overflow
        codes = codes * max(len(values), 1) + indices
        decoders.append((path, indices, values))
    if len(decoders) == 1:
        # One column: its dictionary already is the list of distinct values.
        path, indices, values = decoders[0]
        rows = []
        for value in values:
            row: dict = {}
            _set(row, path, value)
            for placeholder in placeholders:
                _set(row, placeholder, "")
            rows.append(row)
        return DistinctInputs(rows, indices)
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    rows = []
    for row_index in first:
        row = {}
        for path, indices, values in decoders:
            _set(row, path, values[indices[row_index]])
        for path in placeholders:
            _set(row, path, "")
        rows.append(row)
    return DistinctInputs(rows, inverse.reshape(-1))


def _column(table: pa.Table, path: tuple[str | int, ...]):
    """The column at `path`, _ABSENT, or None when it cannot be taken column-wise."""
    head = path[0]
    if not isinstance(head, str):
        return None
    if head not in table.column_names:
        return _ABSENT
    column = table.column(head)
    for key in path[1:]:
        if not (isinstance(key, str) and pa.types.is_struct(column.type)):
            return None
        if column.null_count:
            return None  # a null struct makes the field undefined, not None: go row by row
        if column.type.get_field_index(key) < 0:
            return None  # the parent exists but lacks the field: go row by row, which keeps the parent
        column = pc.struct_field(column, key)
    return column if _scalar(column.type) else None


def _column_type(schema: pa.Schema, path: tuple[str | int, ...]):
    """As _column for a top-level path, from the schema: its type, _ABSENT, or None."""
    head = path[0]
    if not isinstance(head, str):
        return None
    if head not in schema.names:
        return _ABSENT
    type_ = schema.field(head).type
    return type_ if _scalar(type_) else None


def _scalar(type_: pa.DataType) -> bool:
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    return (
        pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_integer(type_)
        or pa.types.is_floating(type_)
    )


def _set(row: dict, path: tuple, value: object) -> None:
    node = row
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value

