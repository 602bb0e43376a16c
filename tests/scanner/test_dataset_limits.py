"""scanner/datasets.py: what a dataset may hold, and the one line naming the row that holds more.
Rows are numbered from 0; a JSONL row is named by its file:line."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from image_preflight.errors import InputError
from image_preflight.scanner import datasets

ROW = '{"image_name": "python", "reward": 1}'


def _files(tmp_path, value: str) -> list:
    """The value in row 1 of a JSON file and line 2 of a JSONL file, with what each names it by."""
    rows = [ROW, ROW.replace("1}", f"{value}}}"), ROW]
    (tmp_path / "d.json").write_text("[\n" + ",\n".join(rows) + "\n]\n")
    (tmp_path / "d.jsonl").write_text("".join(row + "\n" for row in rows))
    return [(tmp_path / "d.json", f"{tmp_path / 'd.json'}: row 1: "),
            (tmp_path / "d.jsonl", f"{tmp_path / 'd.jsonl'}:2: ")]


@pytest.mark.parametrize("value, said", [
    ("7" * 5000, "an integer of 5000 digits (at most 4300)"),
    ("-" + "7" * 4301, "an integer of 4301 digits (at most 4300)"),
    ("1e400", "the number 1e400 is out of range for a double"),
    ("-" + "9" * 400 + ".5", f"the number -{'9' * 39}... (403 characters) is out of range for a double"),
    ("[" * 101 + "]" * 101, "reward[0][0][0]...: nested more than 100 levels deep"),
    ("[" * 5000 + "]" * 5000, "nested more than 100 levels deep"),  # past what the parser itself reads
])
def test_a_number_or_a_depth_past_what_can_be_kept_names_its_row(tmp_path, value, said):
    for path, where in _files(tmp_path, value):
        with pytest.raises(InputError) as raised:
            datasets.read_json_rows(path)
        assert str(raised.value) == where + said


def test_what_can_be_kept_is_read_as_written(tmp_path):
    for value in ("7" * 4300, "1e308", "1e-400", "NaN", "[" * 99 + "]" * 99):
        for path, _ in _files(tmp_path, value):
            assert len(datasets.read_json_rows(path).rows) == 3, (value, path)


def test_a_digit_string_is_no_integer(tmp_path):
    """The digits of a long string are not the number named: the integer past the limit is."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"image_name": "1" * 6000, "n": 0}) + "\n" + '{"n": ' + "2" * 4400 + "}\n")
    with pytest.raises(InputError, match=r":2: an integer of 4400 digits \(at most 4300\)$"):
        datasets.read_json_rows(path)


def test_json_lines_in_another_encoding_are_refused_by_name(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(f"{ROW}\n{ROW}\n".encode("utf-16-le"))
    with pytest.raises(InputError, match=r"d\.jsonl: JSON Lines are UTF-8 \(jsonlines\.org\), this file is UTF-16-LE$"):
        datasets.read_json_rows(path)
    path.write_bytes(f"{ROW}\n{ROW}\n".encode("utf-8-sig"))  # a byte order mark is read past
    assert len(datasets.read_json_rows(path).rows) == 2


def test_a_lone_surrogate_is_written_back_as_the_escape_it_was_read_from(tmp_path):
    source = tmp_path / "d.json"
    source.write_text('[{"image_name": "python", "text": "a\\ud800b \\u00e9"}]')
    read = datasets.read_json_rows(source)
    datasets.write_json_rows(tmp_path / "out.json", read, [True])
    written = (tmp_path / "out.json").read_text(encoding="utf-8")
    assert "\\ud800" in written and json.loads(written) == read.rows


@pytest.mark.parametrize("type_, value, read_as", [
    (pa.date32(), 2**31 - 1, "date32[day]"),
    (pa.timestamp("s"), 2**52, "timestamp[ms]"),  # parquet keeps seconds as milliseconds
    (pa.duration("s"), 2**62, "duration[s]"),
])
def test_a_parquet_value_past_what_python_holds_names_its_row_and_column(tmp_path, type_, value, read_as):
    values = pa.array([0, 0, value, 0], pa.int64()).cast(pa.int32() if type_ == pa.date32() else pa.int64())
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"image_name": pa.array(["a"] * 4), "when": values.cast(type_)}), path, row_group_size=3)
    with pytest.raises(InputError, match=rf"^{path}: row 2: column 'when' \({re.escape(read_as)}\): a value past "
                                         r"what Python holds \(.+\)$"):
        datasets.read_parquet(path)
    assert datasets.read_parquet(path, columns=["image_name"]).num_rows == 4  # only the columns read are checked
