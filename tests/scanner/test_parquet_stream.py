"""Parquet outputs streamed from the input: a batch at a time, in bounded row groups, never partial."""

import pyarrow as pa
import pyarrow.parquet as pq

from image_preflight.cli import main
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.rows.judge import RowJudge, make_template
from image_preflight.scanner import datasets
from image_preflight.scanner.scan import scan

IMAGES = ["good:1", "gone:1", "also:2"]
NESTED = "{{ input.extra.image }}"
SCHEMA = pa.schema([("prompt", pa.list_(pa.string())), ("extra", pa.struct([("image", pa.string())]))],
                   metadata={b"origin": b"verl"})


def verl_row(index: int, image: str) -> dict:
    return {"prompt": [f"task {index}"], "extra": {"image": image}}


def write_table(path, rows, **kwargs) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, **kwargs)


def judge_for(expression: str, *images: str) -> RowJudge:
    return RowJudge(make_template(None, expression), Inventory((NodeImages.from_names("node-1", images),)))


def assert_same_schema(source, output) -> None:
    assert pq.ParquetFile(output).schema.equals(pq.ParquetFile(source).schema)
    assert pq.read_schema(output).equals(pq.read_schema(source), check_metadata=True)


def test_kept_rows_stream_batch_by_batch_into_bounded_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "BATCH_ROWS", 8)
    monkeypatch.setattr(datasets, "ROW_GROUP_BYTES", 1)  # every batch with a kept row is a row group
    rows = [verl_row(i, IMAGES[i % 3]) for i in range(50)]
    source = tmp_path / "train.parquet"
    write_table(source, rows, row_group_size=20)
    (tmp_path / "out").mkdir()

    result = scan([source], judge_for(NESTED, "good:1", "also:2"), out_dir=tmp_path / "out")

    output = tmp_path / "out" / "train.parquet"
    assert [d.row for d in result.files[0].dropped] == [i for i in range(50) if i % 3 == 1]
    assert pq.read_table(output).to_pylist() == [r for i, r in enumerate(rows) if i % 3 != 1]
    assert_same_schema(source, output)
    groups = [pq.ParquetFile(output).metadata.row_group(g).num_rows
              for g in range(pq.ParquetFile(output).metadata.num_row_groups)]
    assert len(groups) > 1 and max(groups) <= 8 and sum(groups) == result.files[0].kept


def test_row_groups_gather_batches_until_they_hold_enough(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "BATCH_ROWS", 4)
    rows = [verl_row(i, IMAGES[i % 3]) for i in range(40)]
    source = tmp_path / "train.parquet"
    write_table(source, rows)
    (tmp_path / "out").mkdir()
    scan([source], judge_for(NESTED, "good:1", "also:2"), out_dir=tmp_path / "out")
    meta = pq.ParquetFile(tmp_path / "out" / "train.parquet").metadata
    assert (meta.num_row_groups, meta.num_rows) == (1, 27)  # ten batches, far below ROW_GROUP_BYTES


def _corrupt_column(path, column: str) -> None:
    """Garbage over the first page header of `column`: the footer and the other columns still read."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(meta.column(c) for c in range(meta.num_columns) if meta.column(c).path_in_schema == column)
    offset = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[offset:offset + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))


def test_a_column_unreadable_past_the_judged_ones_fails_the_output_in_one_line(tmp_path, capsys):
    (tmp_path / "refs.txt").write_text("good:1\n")
    table = pa.table({"image": ["good:1", "gone:1"] * 50, "payload": [f"text {i} " * 20 for i in range(100)]})
    pq.write_table(table, tmp_path / "bad.parquet", compression="none")
    _corrupt_column(tmp_path / "bad.parquet", "payload")
    assert pq.read_table(tmp_path / "bad.parquet", columns=["image"]).num_rows == 100
    (tmp_path / "out").mkdir()
    code = main(["scan", str(tmp_path / "bad.parquet"), "--image", "{{ input.image }}", "--inventory",
                 str(tmp_path / "refs.txt"), "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    assert "bad.parquet: not a readable parquet file" in err
    assert list((tmp_path / "out").iterdir()) == []
