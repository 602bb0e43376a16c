"""`image-preflight scan` on generated hostile inputs: numbers of every size, deep nesting, text in
other encodings or not text at all, files cut short, huge strings, parquet of every column type.
Whatever the input, the command ends in exit 0 or 1, or in one line naming the input and exit 2:
never a traceback. Seeded, so that a failure names a case that can be run again."""

from __future__ import annotations

import decimal
import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from image_preflight.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "swe-smith"
SEED = 20261203
IMAGE = "{{ input.image_name }}:openai"
HELD = "jyangballin/swesmith.x86_64.marshmallow-code_1776_marshmallow.9716fc62"  # held by nodes.json
EXAMPLE_ROWS = [json.loads(line) for line in (EXAMPLE / "train.jsonl").read_text(encoding="utf-8").splitlines()]


def _row(rng: random.Random, **fields) -> dict:
    return {**rng.choice(EXAMPLE_ROWS), **fields}


def _number(rng: random.Random) -> str:
    """A JSON number token, valid or not quite: huge and tiny, many digits, odd forms."""
    def digits(n: int) -> str:
        return str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(n - 1))

    return rng.choice([
        lambda: digits(rng.choice([1, 19, 20, 309, 4300, 4301, 5000, rng.randint(1, 8000)])),
        lambda: "-" + digits(rng.randint(1, 6000)),
        lambda: f"{digits(rng.randint(1, 30))}e{rng.choice(['', '+', '-'])}{rng.randint(0, 100000)}",
        lambda: f"0.{digits(rng.randint(1, 5000))}",
        lambda: f"{digits(400)}.{digits(5)}",
        lambda: rng.choice(["1e400", "-1e400", "1e-400", "1.7976931348623157e308", "1.8e308", "-0", "0.0",
                            "NaN", "Infinity", "-Infinity", "01", "1.", ".5", "+1", "0x10", "1e", "--1"]),
    ])()


def _nested(depth: int, leaf: str, rng: random.Random) -> str:
    opens = "".join(rng.choice(['[', '{"k":']) for _ in range(depth))
    return opens + leaf + "".join("]" if c == "[" else "}" for c in reversed(opens.replace('{"k":', "{")))


def _jsonl(rows: list[str]) -> bytes:
    return "".join(row + "\n" for row in rows).encode("utf-8", "surrogatepass")


def _as_json_list(rows: list[str]) -> bytes:
    return ("[\n" + ",\n".join(rows) + "\n]\n").encode("utf-8", "surrogatepass")


def _dataset(rng: random.Random, rows: list[str]) -> tuple[str, bytes]:
    """The rows (JSON texts) as a JSONL or a JSON file."""
    return rng.choice([("d.jsonl", _jsonl(rows)), ("d.json", _as_json_list(rows))])


def _plain_rows(rng: random.Random, count: int) -> list[str]:
    return [json.dumps(_row(rng, image_name=rng.choice([HELD, "gone/img"]))) for _ in range(count)]


def number_cases(rng: random.Random):
    for index in range(60):
        number = _number(rng)
        field = rng.choice(["image_name", "reward", "nested"])
        value = {"nested": f'{{"a": [{number}]}}'}.get(field, number)
        row = json.dumps(_row(rng, **{"image_name": HELD, field: "@"})).replace('"@"', value)
        rows = _plain_rows(rng, rng.randint(0, 3)) + [row] + _plain_rows(rng, rng.randint(0, 3))
        yield f"number {index}: {field}={number[:40]}", *_dataset(rng, rows)


def depth_cases(rng: random.Random):
    for index in range(40):
        depth = rng.choice([50, 99, 100, 101, 500, 900, 990, 1000, 1100, 5000, 100000, rng.randint(1, 3000)])
        field = rng.choice(["image_name", "problem_statement", "extra"])
        row = json.dumps(_row(rng, **{"image_name": HELD, field: "@"})).replace('"@"', _nested(depth, '"x"', rng))
        rows = _plain_rows(rng, rng.randint(0, 2)) + [row]
        yield f"depth {index}: {field} {depth} deep", *_dataset(rng, rows)
    for index in range(5):
        depth = rng.choice([1000, 5000])
        yield f"depth {index}: a document {depth} deep", *rng.choice([("d.jsonl", _nested(depth, "1", rng).encode()),
                                                                       ("d.json", _nested(depth, "1", rng).encode())])


def encoding_cases(rng: random.Random):
    for index in range(60):
        rows = _plain_rows(rng, rng.randint(1, 4))
        rows[0] = json.dumps(_row(rng, image_name=HELD))  # kept, so that the writers meet what it holds
        kind = rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig", "latin-1 bytes",
                           "invalid utf-8", "lone surrogate escape", "raw surrogate bytes", "nul bytes",
                           "control characters", "astral", "crlf", "cr only"])
        name, data = _dataset(rng, rows)
        text = data.decode("utf-8")
        if kind in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"):
            data = text.encode(kind)
        elif kind == "latin-1 bytes":
            data = text.replace(HELD, HELD + "é", 1).encode("latin-1")
        elif kind == "invalid utf-8":
            at = rng.randrange(len(data))
            data = data[:at] + rng.choice([b"\xff", b"\xc3", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\xc0\xaf"]) + data[at:]
        elif kind == "lone surrogate escape":
            escape = rng.choice(["\\ud800", "\\udfff", "\\udc00\\ud800", "\\ud83d"])
            where = rng.choice(["image_name", "problem_statement", "key"])
            if where == "key":
                data = text.replace('"image_name"', f'"{escape}": 1, "image_name"', 1).encode()
            else:
                data = text.replace(f'"{where}": "', f'"{where}": "{escape}', 1).encode()
        elif kind == "raw surrogate bytes":
            data = text.replace(HELD, HELD + "\udcff", 1).encode("utf-8", "surrogatepass")
        elif kind == "nul bytes":
            data = text.replace("gone", "go\\u0000ne").replace(HELD, HELD[:5] + "\x00" + HELD[5:], 1).encode()
        elif kind == "control characters":
            data = text.replace("gone", "go\\u001b[2Jne\\u0085\\u2028").encode()
        elif kind == "astral":
            data = text.replace("gone", "g\U0001F600ne").encode()
        elif kind == "crlf":
            data = text.replace("\n", "\r\n").encode()
        else:
            data = text.replace("\n", "\r").encode()
        yield f"encoding {index}: {kind}", name, data


def truncation_cases(rng: random.Random):
    for index in range(40):
        name, data = _dataset(rng, _plain_rows(rng, rng.randint(1, 5)))
        cut = rng.randrange(len(data))
        yield f"truncated {index}: {name} at {cut} of {len(data)}", name, data[:cut]
    for index in range(30):
        data = _parquet_bytes(rng, [json.loads(r) for r in _plain_rows(rng, rng.randint(1, 40))])
        cut = rng.choice([0, 4, 8, len(data) - 8, len(data) - 4, len(data) - 1, rng.randrange(len(data))])
        yield f"truncated {index}: parquet at {cut} of {len(data)}", "d.parquet", data[:cut]


def huge_string_cases(rng: random.Random):
    for index in range(12):
        size = rng.choice([1 << 16, 1 << 20, 5 << 20])
        filler = rng.choice(["a", "é", "\U0001F600", ":", "/", "@sha256:", "\\n", "{{ x }}"])
        big = (filler * (size // len(filler)))[:size]
        field = rng.choice(["image_name", "problem_statement", "key"])
        if field == "key":
            row = _row(rng, **{"image_name": HELD, big: 1})
        else:
            row = _row(rng, **{"image_name": HELD, field: big})
        yield f"huge {index}: {field} of {size} ({filler!r})", *_dataset(rng, [json.dumps(row)] + _plain_rows(rng, 2))


def _parquet_bytes(rng: random.Random, rows: list[dict], schema: pa.Schema | None = None) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), sink,
                   compression=rng.choice(["snappy", "none", "zstd"]), row_group_size=rng.choice([1, 3, 1000]))
    return sink.getvalue()


# Columns and the values they hold, of every kind the image may be read from or sit beside.
PARQUET_COLUMNS = [
    (pa.int64(), lambda rng: rng.choice([0, -1, 2**63 - 1, -2**63, rng.randint(-2**63, 2**63 - 1)])),
    (pa.uint64(), lambda rng: rng.choice([0, 2**64 - 1, rng.randint(0, 2**64 - 1)])),
    (pa.float64(), lambda rng: rng.choice([float("nan"), float("inf"), -0.0, 1e308, 5e-324, rng.random()])),
    (pa.float16(), lambda rng: rng.choice([0.5, 65504.0, float("inf")])),
    (pa.decimal128(38, 10), lambda rng: decimal.Decimal(rng.choice(["9" * 28 + ".9999999999", "-1", "0.0000000001"]))),
    (pa.decimal256(76, 0), lambda rng: decimal.Decimal("9" * 76)),
    # Parquet holds seconds as milliseconds: no value past int64's range in those.
    (pa.timestamp("s"), lambda rng: rng.choice([0, 253402300799, 253402300800, 2**52, -2**52])),
    (pa.timestamp("ns", tz="Asia/Kolkata"), lambda rng: rng.choice([0, 2**63 - 1, -2**63 + 1])),
    (pa.date32(), lambda rng: rng.choice([0, 2932896, 2932897, 2**31 - 1, -2**31])),
    (pa.date64(), lambda rng: rng.choice([0, 253402300800000, 86400000 * (2**31 - 1)])),
    (pa.duration("s"), lambda rng: rng.choice([0, 2**62, -2**62])),
    (pa.time64("us"), lambda rng: rng.choice([0, 86399999999])),
    (pa.string(), lambda rng: rng.choice(["", "x" * 100000, "\x00", "é", "\U0001F600"])),
    (pa.binary(), lambda rng: rng.choice([b"", b"\xff\xfe", HELD.encode()])),
    (pa.list_(pa.list_(pa.int64())), lambda rng: [[1, 2**63 - 1], None, []]),
    (pa.struct([("a", pa.struct([("b", pa.timestamp("s"))]))]), lambda rng: {"a": {"b": rng.choice([0, 2**52])}}),
    (pa.map_(pa.string(), pa.date32()), lambda rng: [("k", rng.choice([0, 2**31 - 1]))]),
    (pa.dictionary(pa.int8(), pa.string()), lambda rng: rng.choice([HELD, "gone/img"])),
]


def _parquet_value(rng: random.Random, column: int):
    type_, make = PARQUET_COLUMNS[column]
    if any(test(type_) for test in (pa.types.is_timestamp, pa.types.is_date, pa.types.is_duration, pa.types.is_time)):
        return pa.scalar(make(rng), pa.int64() if not pa.types.is_date32(type_) else pa.int32()).cast(type_)
    return make(rng)


def parquet_cases(rng: random.Random):
    for index in range(50):
        columns = rng.sample(range(len(PARQUET_COLUMNS)), rng.randint(1, 4))
        image_type = rng.choice(["string", "large_string", "int64", "binary", "null", "absent", "dictionary",
                                 "any", "any", "any"])
        image_column = rng.randrange(len(PARQUET_COLUMNS))  # the image read from a column of any type
        fields, rows = [], []
        count = rng.randint(1, 30)
        for position in columns:
            fields.append(pa.field(f"c{position}", PARQUET_COLUMNS[position][0]))
        if image_type != "absent":
            fields.append(pa.field("image_name", {"string": pa.string(), "large_string": pa.large_string(),
                                                  "int64": pa.int64(), "binary": pa.binary(), "null": pa.null(),
                                                  "dictionary": pa.dictionary(pa.int32(), pa.string()),
                                                  "any": PARQUET_COLUMNS[image_column][0]}[image_type]))
        for _ in range(count):
            row = {f"c{position}": _parquet_value(rng, position) for position in columns}
            if image_type in ("string", "large_string", "dictionary"):
                row["image_name"] = rng.choice([HELD, "gone/img", "", "Not A Reference", None])
            elif image_type == "int64":
                row["image_name"] = rng.choice([0, 2**63 - 1, None])
            elif image_type == "binary":
                row["image_name"] = rng.choice([HELD.encode(), b"\xff"])
            elif image_type == "null":
                row["image_name"] = None
            elif image_type == "any":
                row["image_name"] = _parquet_value(rng, image_column)
            rows.append(row)
        arrays = [pa.array([_unwrap(row.get(f.name)) for row in rows], type=f.type) for f in fields]
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), sink,
                       row_group_size=rng.choice([1, 7, 1000]))
        yield f"parquet {index}: {[str(f.type) for f in fields]}", "d.parquet", sink.getvalue()


def _unwrap(value):
    return value.value if isinstance(value, pa.Scalar) else value


def inventory_cases(rng: random.Random):
    """The scan's other input: a node snapshot cut short, in other encodings, with odd numbers."""
    nodes = (EXAMPLE / "nodes.json").read_bytes()
    for index in range(25):
        kind = rng.choice(["cut", "utf-16", "invalid utf-8", "number", "deep"])
        if kind == "cut":
            data = nodes[:rng.randrange(len(nodes))]
        elif kind == "utf-16":
            data = nodes.decode().encode(rng.choice(["utf-16", "utf-32", "utf-8-sig"]))
        elif kind == "invalid utf-8":
            at = rng.randrange(len(nodes))
            data = nodes[:at] + b"\xff" + nodes[at:]
        elif kind == "number":
            data = nodes.replace(b'"sizeBytes": ', b'"sizeBytes": ' + _number(rng).encode() + b', "x": ', 1)
        else:
            deep = _nested(rng.choice([500, 1000, 5000]), "1", rng).encode()
            data = nodes.replace(b'"spec": {}', b'"spec": ' + deep, 1)
        yield f"inventory {index}: {kind}", "nodes.json", data


def _outcome(label: str, argv: list[str], capsys) -> str | None:
    """None when the scan ended as a command should; else what went wrong."""
    try:
        code = main(argv)
    except BaseException as exc:  # noqa: BLE001 - any escape is the failure sought
        return f"{label}: raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    out, err = capsys.readouterr()
    if "Traceback" in err or "Traceback" in out:
        return f"{label}: exit {code} with a traceback: {err[-500:]!r}"
    if code in (0, 1):
        return None
    if code == 2 and err.startswith("image-preflight scan: ") and err.count("\n") == 1 and len(err) < 2000:
        return None
    return f"{label}: exit {code}, stderr {err[:300]!r}"


def _run_all(cases, tmp_path: Path, capsys, *, inventory_case: bool = False) -> None:
    failures = []
    rng = random.Random(SEED + 1)
    for number, (label, name, data) in enumerate(cases):
        folder = tmp_path / str(number)
        folder.mkdir()
        (folder / name).write_bytes(data)
        if inventory_case:
            dataset = folder / "train.jsonl"
            dataset.write_bytes((EXAMPLE / "train.jsonl").read_bytes())
            argv = ["scan", str(dataset), "--image", IMAGE, "--inventory", str(folder / name)]
        else:
            source = (["--template", str(EXAMPLE / "job.yaml")] if rng.random() < 0.5 else ["--image", IMAGE])
            argv = ["scan", str(folder / name), *source, "--inventory", str(EXAMPLE / "nodes.json")]
            if rng.random() < 0.9:  # every writer too
                argv += ["--out-dir", str(folder / "out"), "--report", str(folder / "report.json"),
                         "--missing-images", str(folder / "missing.txt"), "--needed-images", str(folder / "needed.txt")]
            argv += rng.choice([[], ["--output", "json"], ["--keep-unknown"], ["--steer"], ["--fail-on-drop"]])
        failure = _outcome(label, argv, capsys)
        if failure is not None:
            failures.append(failure)
    assert not failures, "\n".join(failures)


def test_numbers_of_any_size_end_in_an_answer_or_one_line(tmp_path, capsys):
    _run_all(number_cases(random.Random(SEED)), tmp_path, capsys)


def test_nesting_of_any_depth_ends_in_an_answer_or_one_line(tmp_path, capsys):
    _run_all(depth_cases(random.Random(SEED)), tmp_path, capsys)


def test_other_encodings_and_bytes_that_are_not_text_end_in_an_answer_or_one_line(tmp_path, capsys):
    _run_all(encoding_cases(random.Random(SEED)), tmp_path, capsys)


def test_files_cut_short_end_in_an_answer_or_one_line(tmp_path, capsys):
    _run_all(truncation_cases(random.Random(SEED)), tmp_path, capsys)


def test_huge_strings_end_in_an_answer_or_one_line(tmp_path, capsys):
    _run_all(huge_string_cases(random.Random(SEED)), tmp_path, capsys)


def test_parquet_columns_of_every_type_end_in_an_answer_or_one_line(tmp_path, capsys):
    _run_all(parquet_cases(random.Random(SEED)), tmp_path, capsys)


def test_hostile_node_snapshots_end_in_an_answer_or_one_line(tmp_path, capsys):
    _run_all(inventory_cases(random.Random(SEED)), tmp_path, capsys, inventory_case=True)


def test_the_installed_command_names_the_row_of_a_5000_digit_integer(tmp_path):
    """The first case found, run as a user runs it: a dataset row holding a 5,000-digit integer."""
    rows = [json.dumps(_row(random.Random(SEED), image_name=HELD)) for _ in range(3)]
    number = "7" * 5000
    rows[1] = rows[1].replace('"image_name"', f'"reward": {number}, "image_name"')
    cases = [("d.jsonl", _jsonl(rows), ":2: an integer of 5000 digits (at most 4300)\n"),
             ("d.json", _as_json_list(rows), ": row 1: an integer of 5000 digits (at most 4300)\n")]
    for name, data, said in cases:
        (tmp_path / name).write_bytes(data)
        done = subprocess.run([sys.executable, "-m", "image_preflight", "scan", str(tmp_path / name), "--image", IMAGE,
                               "--inventory", str(EXAMPLE / "nodes.json")], capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"image-preflight scan: {tmp_path / name}{said}")


def test_the_installed_command_survives_a_sample_of_the_hostile_inputs(tmp_path):
    """A few cases of each kind through the real entry point, a process each: no traceback."""
    rng = random.Random(SEED + 2)
    families = [number_cases, depth_cases, encoding_cases, truncation_cases, parquet_cases]
    for number, family in enumerate(families):
        label, name, data = rng.choice(list(family(random.Random(SEED))))
        path = tmp_path / str(number) / name
        path.parent.mkdir()
        path.write_bytes(data)
        done = subprocess.run([sys.executable, "-m", "image_preflight", "scan", str(path), "--image", IMAGE,
                               "--inventory", str(EXAMPLE / "nodes.json"), "--out-dir", str(path.parent / "out")],
                              capture_output=True, timeout=120)
        err = done.stderr.decode("utf-8", "replace")
        assert b"Traceback" not in done.stderr, (label, err)
        assert done.returncode in (0, 1) or (done.returncode == 2 and err.count("\n") == 1), (label, err)
