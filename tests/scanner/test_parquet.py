"""Parquet datasets: nested struct columns, column-wise grouping, and byte-faithful outputs."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from image_preflight.cli import main
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.rows.judge import RowJudge, make_template
from image_preflight.scanner.scan import scan

NESTED = "{{ input.extra_info.sandbox_overrides.docker_image }}"

EXTRA_INFO = pa.struct(
    [
        ("index", pa.int64()),
        ("sandbox_overrides", pa.struct([("docker_image", pa.string()), ("cpu", pa.float64())])),
    ]
)
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", EXTRA_INFO),
    ],
    metadata={b"huggingface": b'{"info": {"features": "..."}}', b"origin": b"verl"},
)


def verl_row(index, image, *, sandbox=True):
    overrides = {"docker_image": image, "cpu": 1.5} if sandbox else None
    return {
        "data_source": "swe",
        "prompt": [{"role": "user", "content": f"task {index}"}],
        "ability": "coding",
        "reward_model": {"style": "rule", "ground_truth": str(index)},
        "extra_info": {"index": index, "sandbox_overrides": overrides},
    }


def write_table(path: Path, rows, schema=SCHEMA, **kwargs) -> pa.Table:
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path, **kwargs)
    return table


def assert_same_schema(source: Path, output: Path) -> None:
    """The Parquet schema (names, nesting, types) and the Arrow schema with its metadata."""
    assert pq.ParquetFile(output).schema.equals(pq.ParquetFile(source).schema)
    assert pq.read_schema(output).equals(pq.read_schema(source), check_metadata=True)
    assert pq.read_schema(output).metadata[b"origin"] == b"verl"


def inventory(*images):
    return Inventory((NodeImages.from_names("node-1", images),))


def judge_for(expression, *images):
    return RowJudge(make_template(None, expression), inventory(*images))


def dropped_of(result):
    return [(d.row, d.verdict.reason) for f in result.files for d in f.dropped]


def test_nested_struct_image_column_wise_and_output_identical(tmp_path):
    rows = [verl_row(i, ["good:1", "gone:1", "also:2"][i % 3]) for i in range(30)]
    source = tmp_path / "train.parquet"
    write_table(source, rows, row_group_size=7)
    before = source.read_bytes()
    (tmp_path / "out").mkdir()
    judge = judge_for(NESTED, "good:1", "also:2")

    result = scan([source], judge, out_dir=tmp_path / "out")

    assert judge.renders == 3
    assert dropped_of(result) == [(i, "missing") for i in range(30) if i % 3 == 1]
    assert_same_schema(source, tmp_path / "out" / "train.parquet")
    assert pq.read_table(tmp_path / "out" / "train.parquet") == pq.read_table(source).filter(
        pa.array([i % 3 != 1 for i in range(30)])
    )
    assert pq.read_table(tmp_path / "out" / "train.parquet").to_pylist() == [
        r for i, r in enumerate(rows) if i % 3 != 1]
    assert source.read_bytes() == before
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["train.parquet"]


def test_null_struct_is_unrenderable_like_a_json_null_parent(tmp_path):
    rows = [verl_row(0, "good:1"), verl_row(1, "good:1"), verl_row(2, "good:1", sandbox=False), verl_row(3, "gone:1")]
    rows[1]["extra_info"] = None
    source = tmp_path / "train.parquet"
    write_table(source, rows)
    (tmp_path / "out").mkdir()

    result = scan([source], judge_for(NESTED, "good:1"), out_dir=tmp_path / "out")

    assert dropped_of(result) == [(1, "unrenderable"), (2, "unrenderable"), (3, "missing")]
    details = [d.verdict.detail for d in result.files[0].dropped]
    assert all("input.extra_info.sandbox_overrides.docker_image" in detail for detail in details[:2])
    assert "input.extra_info is null" in details[0]
    assert_same_schema(source, tmp_path / "out" / "train.parquet")
    assert pq.read_table(tmp_path / "out" / "train.parquet").to_pylist() == [rows[0]]

    # The same rows as JSONL get the same verdicts.
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert dropped_of(scan([jsonl], judge_for(NESTED, "good:1"))) == dropped_of(result)


def test_null_leaf_renders_none_as_in_json(tmp_path):
    rows = [verl_row(0, "good:1"), verl_row(1, None)]
    source = tmp_path / "train.parquet"
    write_table(source, rows)
    result = scan([source], judge_for(NESTED, "good:1"))
    ((row, verdict),) = [(d.row, d.verdict) for d in result.files[0].dropped]
    assert row == 1 and verdict.reason == "invalid" and verdict.images == ("None",)


def test_struct_without_the_field_keeps_its_parent(tmp_path):
    """`input.extra_info.docker_image is defined` is false, not an error, when the struct lacks it."""
    schema = pa.schema([("image_name", pa.string()), ("extra_info", pa.struct([("index", pa.int64())]))])
    rows = [{"image_name": "good", "extra_info": {"index": 0}}, {"image_name": "gone", "extra_info": {"index": 1}}]
    source = tmp_path / "t.parquet"
    write_table(source, rows, schema=schema)
    expression = (
        "{% if input.extra_info.docker_image is defined %}{{ input.extra_info.docker_image }}"
        "{% else %}{{ input.image_name }}:1{% endif %}"
    )
    assert dropped_of(scan([source], judge_for(expression, "good:1"))) == [(1, "missing")]


def test_missing_column_is_unrenderable_in_every_row(tmp_path):
    source = tmp_path / "t.parquet"
    write_table(source, [{"other": "x"}, {"other": "y"}], schema=pa.schema([("other", pa.string())]))
    result = scan([source], judge_for("{{ input.image_name }}:openai", "x:openai"))
    assert dropped_of(result) == [(0, "unrenderable"), (1, "unrenderable")]
    assert "input.image_name" in result.files[0].dropped[0].verdict.detail


def test_one_render_per_distinct_image_over_many_rows(tmp_path):
    images = ["a:1", "b:1", "c:1"]
    rows = [{"image_name": images[i % 3], "instance_id": f"id-{i}", "n": i} for i in range(1000)]
    source = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source, row_group_size=100)
    judge = judge_for("{{ input.image_name }}", "a:1")
    result = scan([source], judge)
    assert judge.renders == 3
    assert result.files[0].kept == len([r for r in rows if r["image_name"] == "a:1"])


def test_dictionary_encoded_and_integer_columns(tmp_path):
    table = pa.table(
        {
            "repo": pa.array(["x", "y", "x", None]).dictionary_encode(),
            "tag": pa.array([1, 2, 3, 1], type=pa.int32()),
        }
    )
    source = tmp_path / "t.parquet"
    pq.write_table(table, source)
    assert pa.types.is_dictionary(pq.read_schema(source).field("repo").type)
    result = scan([source], judge_for("{{ input.repo }}:{{ input.tag }}", "x:1", "y:2"))
    assert dropped_of(result) == [(2, "missing"), (3, "invalid")]  # "None:1" is not a reference


def test_list_column_is_read_row_by_row(tmp_path):
    schema = pa.schema([("images", pa.list_(pa.string()))])
    source = tmp_path / "t.parquet"
    write_table(source, [{"images": ["a:1", "x"]}, {"images": ["b:1"]}, {"images": []}], schema=schema)
    result = scan([source], judge_for("{{ input.images[0] }}", "a:1"))
    assert dropped_of(result) == [(1, "missing"), (2, "unrenderable")]


def test_cli_mixes_parquet_and_jsonl_and_writes_each_in_its_format(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "refs.txt").write_text("good:1\n")
    rows = [verl_row(i, ["good:1", "gone:1"][i % 2]) for i in range(6)]
    (tmp_path / "data").mkdir()
    write_table(tmp_path / "data" / "a.parquet", rows, compression="zstd")
    (tmp_path / "data" / "b.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    before = {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir()}
    (tmp_path / "out").mkdir()

    code = main(["scan", "data/a.parquet", "data/b.jsonl", "--image", NESTED, "--inventory", "refs.txt",
                 "--out-dir", "out", "--report", "report.json", "--fail-on-drop"])

    assert code == 1
    assert_same_schema(tmp_path / "data" / "a.parquet", tmp_path / "out" / "a.parquet")
    assert pq.read_table(tmp_path / "out" / "a.parquet").to_pylist() == rows[0::2]
    assert pq.ParquetFile(tmp_path / "out" / "a.parquet").metadata.row_group(0).column(0).compression == "ZSTD"
    assert [json.loads(line) for line in (tmp_path / "out" / "b.jsonl").read_text().splitlines()] == rows[0::2]
    assert {p.name: p.read_bytes() for p in (tmp_path / "data").iterdir()} == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.parquet", "b.jsonl"]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(d["file"], d["row"], d["reason"]) for d in report["dropped"]] == [
        ("data/a.parquet", 1, "missing"), ("data/a.parquet", 3, "missing"), ("data/a.parquet", 5, "missing"),
        ("data/b.jsonl", 1, "missing"), ("data/b.jsonl", 3, "missing"), ("data/b.jsonl", 5, "missing"),
    ]
    assert all("line" not in d for d in report["dropped"][:3])


@pytest.mark.parametrize("content", [b"", b"PAR1 not really parquet"])
def test_unreadable_parquet_exits_2(tmp_path, capsys, content):
    (tmp_path / "refs.txt").write_text("good:1\n")
    (tmp_path / "bad.parquet").write_bytes(content)
    assert main(["scan", str(tmp_path / "bad.parquet"), "--image", NESTED,
                 "--inventory", str(tmp_path / "refs.txt")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "bad.parquet" in err


def test_empty_parquet_exits_2(tmp_path, capsys):
    (tmp_path / "refs.txt").write_text("good:1\n")
    write_table(tmp_path / "empty.parquet", [])
    assert main(["scan", str(tmp_path / "empty.parquet"), "--image", NESTED,
                 "--inventory", str(tmp_path / "refs.txt")]) == 2
    assert "empty.parquet: no rows" in capsys.readouterr().err


def test_all_rows_dropped_still_writes_the_schema(tmp_path):
    source = tmp_path / "t.parquet"
    write_table(source, [verl_row(0, "gone:1")])
    (tmp_path / "out").mkdir()
    scan([source], judge_for(NESTED, "good:1"), out_dir=tmp_path / "out")
    assert pq.read_table(tmp_path / "out" / "t.parquet").num_rows == 0
    assert_same_schema(source, tmp_path / "out" / "t.parquet")


def test_legacy_list_naming_is_kept(tmp_path):
    """Files from older writers name list items "item"; the output must not rename them "element"."""
    source = tmp_path / "legacy.parquet"
    write_table(source, [verl_row(0, "good:1"), verl_row(1, "gone:1")], use_compliant_nested_type=False)
    assert "item" in str(pq.ParquetFile(source).schema)
    (tmp_path / "out").mkdir()
    scan([source], judge_for(NESTED, "good:1"), out_dir=tmp_path / "out")
    assert_same_schema(source, tmp_path / "out" / "legacy.parquet")
    assert pq.read_table(tmp_path / "out" / "legacy.parquet").to_pylist() == [verl_row(0, "good:1")]
