"""`image-preflight scan` end to end: datasets in, kept rows and reports out, exit codes."""

import json
import os
import re
import stat
import time
from pathlib import Path

import pytest

from image_preflight import load_inventory
from image_preflight.cli import main
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.rows.judge import DROP_REASONS
from image_preflight.scanner import filter_rows
from tests.builders.nodes import kube_node, library_images
from tests.builders.rows import SWE_TEMPLATE

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "swe-smith"

TEMPLATE = SWE_TEMPLATE
IMAGE = "{{ input.image_name }}:openai"


def write_nodes(path: Path, *nodes) -> Path:
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(nodes)}))
    return path


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def rows_of(*names):
    return [{"instance_id": f"id-{i}", "image_name": name} for i, name in enumerate(names)]


def summary(stdout: str) -> dict[str, dict[str, int]]:
    """The plain summary lines (stdout not a terminal) as {file: {count: n}}, every reason counted."""
    table = {}
    for line in stdout.splitlines():
        found = re.fullmatch(r"scanned (.+): rows (\d+), kept (\d+)(?: \((\d+) unconfirmed\))?, dropped (\d+)"
                             r"(?: \((.+)\))?", line)
        if found is None:
            continue
        name, rows, kept, unconfirmed, dropped, reasons = found.groups()
        counts = {"rows": int(rows), "kept": int(kept), "unconfirmed": int(unconfirmed or 0), "dropped": int(dropped)}
        counts.update({reason: 0 for reason in DROP_REASONS})
        for part in (reasons or "").split(", ") if reasons else ():
            reason, count = part.rsplit(" ", 1)
            counts[reason] = int(count)
        table[name] = counts
    return table


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working directory with a one-node inventory holding `good:openai` and `other:openai`."""
    monkeypatch.chdir(tmp_path)
    write_nodes(tmp_path / "nodes.json", kube_node("node-a", library_images("good:openai", "other:openai")))
    (tmp_path / "job.yaml").write_text(TEMPLATE)
    return tmp_path


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# --- the example from the README ------------------------------------------------------------------


def test_readme_command_drops_rows_whose_images_cpu_node_1_lacks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    datasets = ["examples/swe-smith/train.jsonl", "examples/swe-smith/val.jsonl"]
    before = {name: (REPO / name).read_bytes() for name in datasets}
    report = tmp_path / "report.json"
    code = main(
        ["scan", *datasets, "--template", "examples/swe-smith/job.yaml", "--inventory", "examples/swe-smith/nodes.json",
         "--report", str(report)]
    )
    assert code == 0

    # agent-lightning's template selects no node and tolerates nothing: every untainted node is
    # eligible, which leaves cpu-node-1 (gpu-node-1 carries nvidia.com/gpu:NoSchedule).
    nodes = json.loads((EXAMPLE / "nodes.json").read_text())["items"]
    (cpu,) = [n for n in nodes if not n["spec"].get("taints")]
    assert cpu["metadata"]["name"] == "cpu-node-1"
    held = {name.removeprefix("docker.io/") for image in cpu["status"]["images"] for name in image["names"]}
    expected = {}
    for name in datasets:
        lines = (REPO / name).read_text().splitlines()
        for number, line in enumerate(lines):  # rows numbered from 0
            row = json.loads(line)
            if "image_name" not in row:
                expected[(name, number)] = ("unrenderable", [])
            elif f"{row['image_name']}:openai" not in held:
                expected[(name, number)] = ("missing", [f"{row['image_name']}:openai"])
    assert len({images[0] for reason, images in expected.values() if reason == "missing"}) == 3

    written = json.loads(report.read_text())
    dropped = written["dropped"]
    assert {(d["file"], d["row"]): (d["reason"], d["images"]) for d in dropped} == expected
    assert all(d["nodes"] == ["cpu-node-1"] for d in dropped if d["reason"] == "missing")
    # One train row lacks problem_statement, printed only as text: kept, and counted.
    lacking = {f["file"]: f["kept_lacking"] for f in written["files"]}
    assert lacking == {datasets[0]: {"input.problem_statement": 1}, datasets[1]: {}}

    table = summary(capsys.readouterr().out)
    for name in datasets:
        total = len((REPO / name).read_text().splitlines())
        drops = [reason for (file, _), (reason, _) in expected.items() if file == name]
        assert table[name]["rows"] == total
        assert table[name]["kept"] == total - len(drops)
        assert table[name]["missing"] == drops.count("missing")
        assert table[name]["unrenderable"] == drops.count("unrenderable")
    assert {name: (row["rows"], row["kept"], row["missing"], row["unrenderable"]) for name, row in table.items()} == {
        datasets[0]: (40, 23, 17, 0), datasets[1]: (12, 8, 3, 1)}
    assert {name: (REPO / name).read_bytes() for name in datasets} == before


# --- kept rows written out ------------------------------------------------------------------------


def test_out_dir_gets_the_kept_rows_verbatim_in_order(work, capsys):
    lines = [
        '{"image_name": "good", "note": "caf\\u00e9", "n": 1.50}',
        '{ "image_name" : "missing1" }',
        "",
        '{"n": 3, "image_name": "other", "nested": {"b": [1, 2], "a": null}}',
        '{"image_name":"good","z":"ünï"}',
    ]
    (work / "data").mkdir()
    source = work / "data" / "train.jsonl"
    source.write_bytes(("\n".join(lines) + "\n").encode())
    listing = [{"image_name": "missing2", "k": 1}, {"image_name": "good", "k": 2, "deep": {"x": [None, True]}}]
    (work / "data" / "val.json").write_text(json.dumps(listing))
    before = snapshot(work / "data")
    (work / "out").mkdir()

    code = main(["scan", "data/train.jsonl", "data/val.json", "--template", "job.yaml", "--inventory", "nodes.json",
                 "--out-dir", "out"])

    assert code == 0
    assert (work / "out" / "train.jsonl").read_bytes() == (
        "\n".join([lines[0], lines[3], lines[4]]) + "\n"
    ).encode()
    assert json.loads((work / "out" / "val.json").read_text()) == [listing[1]]
    assert sorted(p.name for p in (work / "out").iterdir()) == ["train.jsonl", "val.json"]  # no temp files
    assert snapshot(work / "data") == before
    out = capsys.readouterr().out
    table = summary(out)
    assert table["data/train.jsonl"] == {
        "rows": 4, "kept": 3, "unconfirmed": 0, "dropped": 1, "missing": 1, "unknown": 0, "unrenderable": 0,
        "invalid": 0, "no-eligible-node": 0, "no-sandbox-image": 0,
    }
    assert table["data/val.json"]["kept"] == 1 and table["data/val.json"]["missing"] == 1


def test_crlf_lines_and_a_last_line_without_newline_are_kept_verbatim(work):
    (work / "data").mkdir()
    (work / "data" / "train.jsonl").write_bytes(
        b'\xef\xbb\xbf{"image_name": "good"}\r\n{"image_name": "lost"}\r\n\r\n{"image_name": "other"}'
    )
    (work / "out").mkdir()
    assert main(["scan", "data/train.jsonl", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "out"]) == 0
    assert (work / "out" / "train.jsonl").read_bytes() == (
        b'\xef\xbb\xbf{"image_name": "good"}\r\n{"image_name": "other"}\n'
    )


def test_out_dir_holding_an_input_is_refused(work, capsys):
    write_jsonl(work / "train.jsonl", rows_of("good", "missing"))
    before = snapshot(work)
    code = main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "."])
    assert code == 2
    assert "train.jsonl" in one_line_error(capsys)
    assert snapshot(work) == before


def test_output_that_would_replace_the_inventory_is_refused(work, capsys):
    (work / "data").mkdir()
    (work / "data" / "nodes.json").write_text(json.dumps([{"image_name": "good"}]))  # a dataset named nodes.json
    before = snapshot(work)
    assert main(["scan", "data/nodes.json", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "."]) == 2
    assert "nodes.json" in one_line_error(capsys)
    assert snapshot(work) == before


def test_out_dir_that_does_not_exist_is_created(work):
    write_jsonl(work / "train.jsonl", rows_of("good"))
    assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "new/dir"]) == 0
    assert (work / "new" / "dir" / "train.jsonl").read_text() == (work / "train.jsonl").read_text()


def test_a_created_out_dir_is_removed_again_when_the_scan_fails(work, capsys):
    write_jsonl(work / "train.jsonl", rows_of("good"))
    (work / "broken.jsonl").write_text("{not json\n")
    before = snapshot(work)
    args = ["scan", "train.jsonl", "broken.jsonl", "--image", IMAGE, "--inventory", "nodes.json",
            "--out-dir", "new/dir"]
    assert main(args) == 2
    assert "broken.jsonl:1" in one_line_error(capsys)
    assert snapshot(work) == before and not (work / "new").exists()


def test_out_dir_that_is_a_file_is_refused(work, capsys):
    write_jsonl(work / "train.jsonl", rows_of("good"))
    (work / "taken").write_text("")
    assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "taken"]) == 2
    assert "taken: --out-dir is not a directory" in one_line_error(capsys)


@pytest.mark.parametrize("option", ["--report", "--missing-images", "--needed-images"])
def test_an_unwritable_report_path_writes_nothing(work, capsys, option):
    write_jsonl(work / "train.jsonl", rows_of("good", "lost"))
    (work / "out").mkdir()
    before = snapshot(work)
    args = ["scan", "train.jsonl", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "out",
            option, "no/such/folder/file"]
    assert main(args) == 2
    assert "no/such/folder/file: cannot write" in one_line_error(capsys)
    assert snapshot(work) == before


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_outputs_get_the_mode_the_umask_gives(work, mask):
    """Another uid (a Ray worker) must be able to read the filtered dataset as it could any file."""
    write_jsonl(work / "train.jsonl", rows_of("good", "lost"))
    old = os.umask(mask)
    try:
        assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "out",
                     "--report", "report.json", "--missing-images", "missing.txt",
                     "--needed-images", "needed.txt"]) == 0
    finally:
        os.umask(old)
    for path in ("out/train.jsonl", "report.json", "missing.txt", "needed.txt"):
        assert stat.S_IMODE((work / path).stat().st_mode) == 0o666 & ~mask, path


def test_a_lone_surrogate_in_an_image_is_printed_and_written_as_an_escape(work, capsys):
    (work / "train.jsonl").write_text('{"image_name": "lost\\udc80"}\n{"image_name": "good"}\n')
    code = main(["scan", "train.jsonl", "--image", "{{ input.image_name }}:openai", "--inventory", "nodes.json",
                 "--report", "report.json", "--missing-images", "missing.txt"])
    assert code == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "lost" in captured.out
    json.loads((work / "report.json").read_text(encoding="utf-8"))
    (work / "missing.txt").read_text(encoding="utf-8")


def test_two_inputs_with_one_file_name_are_refused(work, capsys):
    for folder in ("a", "b"):
        (work / folder).mkdir()
        write_jsonl(work / folder / "train.jsonl", rows_of("good"))
    (work / "out").mkdir()
    code = main(["scan", "a/train.jsonl", "b/train.jsonl", "--image", IMAGE, "--inventory", "nodes.json",
                 "--out-dir", "out"])
    assert code == 2
    assert "train.jsonl" in one_line_error(capsys)
    assert list((work / "out").iterdir()) == []


def test_an_unreadable_later_input_leaves_no_output_of_an_earlier_one(work, capsys):
    write_jsonl(work / "first.jsonl", rows_of("good", "missing"))
    (work / "second.jsonl").write_text('{"image_name": "good"}\n{"image_name": \n')
    (work / "out").mkdir()
    code = main(["scan", "first.jsonl", "second.jsonl", "--image", IMAGE, "--inventory", "nodes.json",
                 "--out-dir", "out"])
    assert code == 2
    assert "second.jsonl:2" in one_line_error(capsys)
    assert list((work / "out").iterdir()) == []


def test_an_existing_output_is_replaced(work):
    write_jsonl(work / "train.jsonl", rows_of("good", "missing"))
    (work / "out").mkdir()
    (work / "out" / "train.jsonl").write_text("stale\n" * 100)
    assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "out"]) == 0
    assert [json.loads(line)["image_name"] for line in (work / "out" / "train.jsonl").read_text().splitlines()] == [
        "good"
    ]


# --- reports --------------------------------------------------------------------------------------


def test_report_lists_every_dropped_row(work, capsys):
    rows = rows_of("good", "lost-a", "Bad", "lost-b") + [{"instance_id": "no-image"}] + rows_of("lost-a")
    (work / "train.jsonl").write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))  # a blank first line
    code = main(["scan", "train.jsonl", "--template", "job.yaml", "--inventory", "nodes.json",
                 "--report", "report.json", "--missing-images", "missing.txt"])
    assert code == 0
    report = json.loads((work / "report.json").read_text())
    # Rows are numbered from 0, a blank line being no row, in the report as on stdout.
    dropped = [{k: d[k] for k in ("file", "row", "reason", "images", "nodes")} for d in report["dropped"]]
    assert all(set(d) <= {"file", "row", "reason", "images", "nodes", "detail"} for d in report["dropped"])
    assert dropped == [
        {"file": "train.jsonl", "row": 1, "reason": "missing", "images": ["lost-a:openai"], "nodes": ["node-a"]},
        {"file": "train.jsonl", "row": 2, "reason": "invalid", "images": ["Bad:openai"], "nodes": []},
        {"file": "train.jsonl", "row": 3, "reason": "missing", "images": ["lost-b:openai"], "nodes": ["node-a"]},
        {"file": "train.jsonl", "row": 4, "reason": "unrenderable", "images": [], "nodes": []},
        {"file": "train.jsonl", "row": 5, "reason": "missing", "images": ["lost-a:openai"], "nodes": ["node-a"]},
    ]
    assert "input.image_name" in report["dropped"][3]["detail"]
    assert report["files"][0]["rows"] == 6 and report["files"][0]["kept"] == 1
    # The build list names each image as the runtime does, as the pin list does.
    assert (work / "missing.txt").read_text() == "docker.io/library/lost-a:openai\ndocker.io/library/lost-b:openai\n"
    assert report["missing_images"] == [{"image": "docker.io/library/lost-a:openai", "rows": 2},
                                        {"image": "docker.io/library/lost-b:openai", "rows": 1}]
    out = capsys.readouterr().out
    assert "dropped train.jsonl row 4: unrenderable: field input.image_name: missing\n" in out
    # The Python API numbers them alike.
    _, api_dropped = filter_rows(rows, template=TEMPLATE, inventory=load_inventory(work / "nodes.json"))
    assert [index for index, _, _ in api_dropped] == [d["row"] for d in report["dropped"]]


@pytest.mark.parametrize("option", ["--report", "--missing-images", "--needed-images"])
@pytest.mark.parametrize("target", ["train.jsonl", "nodes.json", "job.yaml"])
def test_report_over_an_input_is_refused(work, capsys, option, target):
    write_jsonl(work / "train.jsonl", rows_of("good", "missing"))
    before = snapshot(work)
    args = ["scan", "train.jsonl", "--template", "job.yaml", "--inventory", "nodes.json", option, target]
    assert main(args) == 2
    assert option in one_line_error(capsys)
    assert snapshot(work) == before


# --- the images to pin: --needed-images and image_preflight.needed_images ------------------------

PIN_TEMPLATE = """apiVersion: batch/v1
kind: Job
metadata:
  name: {{ job_name }}
spec:
  template:
    spec:
      restartPolicy: Never
      initContainers:
      - name: setup
        image: {{ (input.tools ~ ":v1") | yaml_escape }}
      containers:
      - name: rollout
        image: {{ input.image_name | yaml_escape }}
        imagePullPolicy: IfNotPresent
      - name: proxy
        image: proxy:v2
      - name: fetch
        image: busybox:latest
"""
PIN_NEEDED = ["docker.io/library/good:openai", "docker.io/library/other:openai", "docker.io/library/proxy:v2",
              "docker.io/library/tools-a:v1"]


@pytest.fixture
def pin_rows(work):
    """Two datasets for PIN_TEMPLATE in `work`: a JSONL file and a parquet one (judged column-wise);
    their rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_nodes(work / "nodes.json", kube_node("node-a", library_images("good:openai", "other:openai", "tools-a:v1",
                                                                        "tools-b:v1", "proxy:v2")))
    (work / "pin.yaml").write_text(PIN_TEMPLATE)
    train = [{"image_name": "good:openai", "tools": "tools-a"},
             {"image_name": "lost:openai", "tools": "tools-b"},  # dropped: neither of its images is needed
             {"image_name": "docker.io/library/good:openai", "tools": "tools-a"},  # the same image as row 0
             {"image_name": "good:openai", "tools": "tools-a"}]
    write_jsonl(work / "train.jsonl", train)
    val = [{"image_name": "other:openai", "tools": "tools-a"}] * 500
    val.append({"image_name": "good:openai", "tools": "tools-a"})
    pq.write_table(pa.Table.from_pylist(val), work / "val.parquet")
    return train + val


def needed_lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return text.splitlines()


def test_needed_images_are_the_kept_rows_images_each_once(work, pin_rows):
    """Init containers count; an Always image (busybox:latest) is the kubelet's to pull, not the
    node's to hold; a dropped row's images are not needed; `good:openai` and
    `docker.io/library/good:openai` are one image, and rows and files sharing one collapse."""
    assert main(["scan", "train.jsonl", "val.parquet", "--template", "pin.yaml", "--inventory", "nodes.json",
                 "--out-dir", "out", "--needed-images", "needed.txt", "--report", "report.json"]) == 0
    assert needed_lines(work / "needed.txt") == PIN_NEEDED
    assert [f["kept"] for f in json.loads((work / "report.json").read_text())["files"]] == [3, 501]


def test_needed_images_of_rows_judged_one_by_one(work):
    """A list column is read row by row, not column-wise: the same images come out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"images": ["good:openai", "x"]}, {"images": ["lost:openai"]}, {"images": ["good:openai"]}, {"images": []}]
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("images", pa.list_(pa.string()))])),
                   work / "t.parquet")
    assert main(["scan", "t.parquet", "--image", "{{ input.images[0] }}", "--inventory", "nodes.json",
                 "--needed-images", "needed.txt"]) == 0
    assert needed_lines(work / "needed.txt") == ["docker.io/library/good:openai"]


def test_the_api_returns_the_lines_the_file_holds(work, pin_rows):
    import image_preflight

    assert main(["scan", "train.jsonl", "val.parquet", "--template", "pin.yaml", "--inventory", "nodes.json",
                 "--needed-images", "needed.txt"]) == 0
    inventory = image_preflight.load_inventory(work / "nodes.json")
    needed = image_preflight.needed_images(pin_rows, template=PIN_TEMPLATE, inventory=inventory)
    assert needed == needed_lines(work / "needed.txt") == PIN_NEEDED
    kept, _ = image_preflight.filter_rows(pin_rows, template=PIN_TEMPLATE, inventory=inventory)
    assert image_preflight.needed_images(kept, template=PIN_TEMPLATE, inventory=inventory) == PIN_NEEDED
    assert image_preflight.needed_images(iter(pin_rows[1:2]), template=PIN_TEMPLATE, inventory=inventory) == []


def test_rows_kept_unknown_need_their_images(work):
    filler = [f"filler-{i}:v1" for i in range(49)]
    # 50 images: the kubelet's cap
    write_nodes(work / "big.json", kube_node("big", library_images("good:openai", *filler)))
    write_jsonl(work / "train.jsonl", rows_of("good", "absent", "lost"))
    args = ["scan", "train.jsonl", "--image", IMAGE, "--inventory", "big.json", "--needed-images", "needed.txt"]
    assert main(args) == 0
    assert needed_lines(work / "needed.txt") == ["docker.io/library/good:openai"]
    assert main([*args, "--keep-unknown"]) == 0
    expected = ["docker.io/library/absent:openai", "docker.io/library/good:openai", "docker.io/library/lost:openai"]
    assert needed_lines(work / "needed.txt") == expected

    from image_preflight import load_inventory, needed_images

    rows = rows_of("good", "absent", "lost")
    inventory = load_inventory(work / "big.json")
    assert needed_images(rows, image=IMAGE, inventory=inventory, keep_unknown=True) == expected
    assert needed_images(rows, image=IMAGE, inventory=inventory) == ["docker.io/library/good:openai"]


def test_needed_images_replace_the_file_in_one_step_and_only_when_the_scan_succeeds(work, capsys):
    write_jsonl(work / "train.jsonl", rows_of("good", "lost"))
    (work / "broken.jsonl").write_text('{"image_name": "other"}\n{"image_name": \n')
    (work / "needed.txt").write_text("stale:1\n" * 100)
    args = ["--image", IMAGE, "--inventory", "nodes.json", "--needed-images", "needed.txt"]

    assert main(["scan", "train.jsonl", "broken.jsonl", *args]) == 2
    assert "broken.jsonl:2" in one_line_error(capsys)
    assert (work / "needed.txt").read_text() == "stale:1\n" * 100  # untouched, no temp file beside it
    assert sorted(p.name for p in work.iterdir()) == ["broken.jsonl", "job.yaml", "needed.txt", "nodes.json",
                                                      "train.jsonl"]

    inode = (work / "needed.txt").stat().st_ino
    assert main(["scan", "train.jsonl", *args]) == 0
    assert (work / "needed.txt").read_text() == "docker.io/library/good:openai\n"
    assert (work / "needed.txt").stat().st_ino != inode  # a new file moved into place, not rewritten
    assert sorted(p.name for p in work.iterdir()) == ["broken.jsonl", "job.yaml", "needed.txt", "nodes.json",
                                                      "train.jsonl"]


@pytest.mark.parametrize(("other", "target"), [(["--missing-images", "same.txt"], "same.txt"),
                                               (["--missing-images", "same.txt"], "./same.txt"),
                                               (["--report", "same.txt"], "same.txt"),
                                               (["--out-dir", "out"], "out/train.jsonl")])
def test_needed_images_over_another_output_is_refused(work, capsys, other, target):
    write_jsonl(work / "train.jsonl", rows_of("good", "lost"))
    (work / "out").mkdir()
    before = snapshot(work)
    assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "nodes.json", *other,
                 "--needed-images", target]) == 2
    err = one_line_error(capsys)
    assert "--needed-images" in err and other[0] in err
    assert snapshot(work) == before and sorted(p.name for p in work.iterdir()) == ["job.yaml", "nodes.json", "out",
                                                                                 "train.jsonl"]


def test_image_shortcut_drops_like_the_template(work):
    rows = rows_of("good", "lost", "Bad", "other") + [{"x": 1}]
    write_jsonl(work / "train.jsonl", rows)
    for name, source in (("template", ["--template", "job.yaml"]), ("image", ["--image", IMAGE])):
        assert main(["scan", "train.jsonl", *source, "--inventory", "nodes.json", "--report", f"{name}.json"]) == 0
    by_template = json.loads((work / "template.json").read_text())["dropped"]
    by_image = json.loads((work / "image.json").read_text())["dropped"]
    assert [(d["row"], d["reason"], d["images"]) for d in by_image] == [
        (d["row"], d["reason"], d["images"]) for d in by_template
    ]
    assert [d["reason"] for d in by_image] == ["missing", "invalid", "unrenderable"]


# --- inventories and placement --------------------------------------------------------------------


@pytest.mark.parametrize(("require", "kept"), [("all", 1), ("any", 2), ("steer", 2)])
def test_require_all_or_any_node_or_steer(work, require, kept):
    """--steer keeps a row when one eligible node holds its images, as `serve --steer` admits its Job."""
    write_nodes(work / "two.json", kube_node("n1", library_images("shared:openai", "only-n1:openai")),
                kube_node("n2", library_images("shared:openai")))
    write_jsonl(work / "train.jsonl", rows_of("shared", "only-n1", "nowhere"))
    choice = ["--steer"] if require == "steer" else ["--require", require]
    code = main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "two.json", *choice,
                 "--report", "report.json"])
    assert code == 0
    report = json.loads((work / "report.json").read_text())
    assert report["files"][0]["kept"] == kept
    by_row = {d["row"]: d for d in report["dropped"]}
    assert by_row[2]["reason"] == "missing" and sorted(by_row[2]["nodes"]) == ["n1", "n2"]
    if require == "all":
        assert by_row[1]["reason"] == "missing" and by_row[1]["nodes"] == ["n2"]
    else:
        assert 1 not in by_row


def test_steer_takes_no_require(work, capsys):
    write_nodes(work / "two.json", kube_node("n1", library_images("shared:openai")))
    write_jsonl(work / "train.jsonl", rows_of("shared"))
    assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "two.json", "--steer",
                 "--require", "any"]) == 2
    assert "--steer" in one_line_error(capsys)


def test_truncated_node_list_is_unknown_unless_kept(work):
    filler = [f"filler-{i}:v1" for i in range(49)]
    # 50 images: the kubelet's cap
    write_nodes(work / "big.json", kube_node("big", library_images("good:openai", *filler)))
    write_jsonl(work / "train.jsonl", rows_of("good", "absent"))
    args = ["scan", "train.jsonl", "--image", IMAGE, "--inventory", "big.json", "--report", "report.json"]

    assert main(args) == 0
    report = json.loads((work / "report.json").read_text())
    assert [(d["row"], d["reason"], d["nodes"]) for d in report["dropped"]] == [(1, "unknown", ["big"])]
    assert main([*args, "--missing-images", "missing.txt"]) == 0
    assert (work / "missing.txt").read_text() == ""  # unknown is not missing

    assert main([*args, "--keep-unknown"]) == 0
    assert json.loads((work / "report.json").read_text())["dropped"] == []

    assert main([*args, "--max-images", "-1"]) == 0  # no cap: the list is complete
    assert [d["reason"] for d in json.loads((work / "report.json").read_text())["dropped"]] == ["missing"]


def test_node_selector_matching_no_node_is_no_eligible_node(work):
    (work / "gpu.yaml").write_text(TEMPLATE.replace("      restartPolicy: Never\n",
                                                    "      restartPolicy: Never\n      nodeSelector: {pool: gpu}\n"))
    write_jsonl(work / "train.jsonl", rows_of("good"))
    code = main(["scan", "train.jsonl", "--template", "gpu.yaml", "--inventory", "nodes.json", "--report", "r.json"])
    assert code == 0
    (dropped,) = json.loads((work / "r.json").read_text())["dropped"]
    assert dropped["reason"] == "no-eligible-node"


def test_tainted_node_is_not_eligible(work):
    write_nodes(work / "two.json",
                kube_node("gpu", library_images("good:openai"), taints=[{"key": "gpu", "effect": "NoSchedule"}]),
                kube_node("cpu", library_images("other:openai")))
    write_jsonl(work / "train.jsonl", rows_of("good"))
    assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "two.json", "--report", "r.json"]) == 0
    (dropped,) = json.loads((work / "r.json").read_text())["dropped"]
    assert (dropped["reason"], dropped["nodes"]) == ("missing", ["cpu"])


def test_several_inventory_files_are_merged(work):
    (work / "crictl.json").write_text(json.dumps({"images": [{"id": "sha256:" + "a" * 64,
                                                              "repoTags": ["docker.io/library/x:1"]}]}))
    (work / "refs.txt").write_text("lost:openai\n")
    write_jsonl(work / "train.jsonl", rows_of("lost", "good"))
    code = main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "crictl.json", "--inventory", "refs.txt",
                 "--report", "r.json"])
    assert code == 0
    dropped = json.loads((work / "r.json").read_text())["dropped"]
    assert [(d["row"], sorted(d["nodes"])) for d in dropped] == [(0, ["crictl"]), (1, ["crictl", "refs"])]


# --- exit codes -----------------------------------------------------------------------------------


def test_fail_on_drop(work):
    write_jsonl(work / "some.jsonl", rows_of("good", "lost"))
    write_jsonl(work / "none.jsonl", rows_of("good", "other"))
    base = ["--image", IMAGE, "--inventory", "nodes.json"]
    assert main(["scan", "some.jsonl", *base]) == 0
    assert main(["scan", "some.jsonl", *base, "--fail-on-drop"]) == 1
    assert main(["scan", "none.jsonl", *base, "--fail-on-drop"]) == 0


@pytest.mark.parametrize(
    ("files", "template", "inventory", "expected"),
    [
        ({"d.jsonl": '{"image_name": "good"}\n{"image_name": good}\n'}, None, None, "d.jsonl:2"),
        ({"d.jsonl": '{"image_name": "good"}\n[1, 2]\n'}, None, None, "d.jsonl:2"),
        ({}, None, None, "d.jsonl"),  # no such file
        ({"d.jsonl": ""}, None, None, "d.jsonl"),
        ({"d.jsonl": "\n\n"}, None, None, "d.jsonl"),
        ({"d.json": "[]"}, None, None, "d.json"),
        ({"d.json": '{"image_name": "good"}'}, None, None, "d.json"),
        ({"d.csv": "image_name\ngood\n"}, None, None, "d.csv"),
        ({"d.jsonl": '{"image_name": "good"}\n'}, None, '{"apiVersion": "v1", "kind": "Secret"}', "inv.json"),
        ({"d.jsonl": '{"image_name": "good"}\n'}, None, "", "inv.json"),
        ({"d.jsonl": '{"image_name": "good"}\n'}, TEMPLATE + "---\n" + TEMPLATE, None, "t.yaml"),
        ({"d.jsonl": '{"image_name": "good"}\n'}, TEMPLATE.replace("kind: Job", "kind: Pod"), None, "t.yaml"),
        ({"d.jsonl": '{"image_name": "good"}\n'}, TEMPLATE.replace("}}\n", "\n", 1), None, "t.yaml:"),
    ],
)
def test_bad_input_exits_2_with_one_line(work, capsys, files, template, inventory, expected):
    for name, text in files.items():
        (work / name).write_text(text)
    dataset = next(iter(files), "d.jsonl")
    args = ["scan", dataset, "--inventory", "nodes.json"]
    if inventory is not None:
        (work / "inv.json").write_text(inventory)
        args[-1] = "inv.json"
    if template is not None:
        (work / "t.yaml").write_text(template)
        args += ["--template", "t.yaml"]
    else:
        args += ["--image", IMAGE]
    assert main(args) == 2
    err = one_line_error(capsys)
    assert err.startswith("image-preflight scan: ")
    assert expected in err


def test_syntax_error_names_the_template_line(work, capsys):
    (work / "t.yaml").write_text(TEMPLATE.replace("(input.image_name ~", "(input.image_name ~~"))
    write_jsonl(work / "d.jsonl", rows_of("good"))
    assert main(["scan", "d.jsonl", "--template", "t.yaml", "--inventory", "nodes.json"]) == 2
    line = TEMPLATE.splitlines().index('        image: {{ (input.image_name ~ ":openai") | yaml_escape }}') + 1
    assert f"t.yaml:{line}:" in one_line_error(capsys)


def test_missing_template_file(work, capsys):
    write_jsonl(work / "d.jsonl", rows_of("good"))
    assert main(["scan", "d.jsonl", "--template", "nope.yaml", "--inventory", "nodes.json"]) == 2
    assert "nope.yaml" in one_line_error(capsys)


def test_missing_inventory_file(work, capsys):
    write_jsonl(work / "d.jsonl", rows_of("good"))
    assert main(["scan", "d.jsonl", "--image", IMAGE, "--inventory", "gone.json"]) == 2
    assert "gone.json" in one_line_error(capsys)


def test_unknown_extension_is_refused_before_anything_is_read(work, capsys):
    write_jsonl(work / "good.jsonl", rows_of("good"))
    (work / "d.txt").write_text("x\n")
    (work / "out").mkdir()
    assert main(["scan", "good.jsonl", "d.txt", "--image", IMAGE, "--inventory", "nodes.json", "--out-dir", "out"]) == 2
    assert "d.txt" in one_line_error(capsys)
    assert list((work / "out").iterdir()) == []


def test_template_and_image_are_exclusive(work, capsys):
    write_jsonl(work / "d.jsonl", rows_of("good"))
    assert main(["scan", "d.jsonl", "--image", IMAGE, "--template", "job.yaml", "--inventory", "nodes.json"]) == 2
    assert one_line_error(capsys).strip() == ("image-preflight scan: argument --template: not allowed with argument "
                                              "--image (see image-preflight scan --help)")


def test_filter_rows_judges_agent_leases_at_the_current_time():
    observed = time.time() - 3600
    expired = Inventory((NodeImages.from_names("cpu-1", ["app:openai"], observed_at=observed,
                                                 expires_at=observed + 300, source="cri"),))
    rows = [{"image_name": "app"}, {"image_name": "gone"}]
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=expired)
    assert kept == [rows[0]]
    assert [(index, verdict.reason) for index, _, verdict in dropped] == [(1, "unknown")]
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=expired, now=observed)
    assert [(index, verdict.reason) for index, _, verdict in dropped] == [(1, "missing")]


def test_a_reader_that_leaves_early_costs_no_traceback_and_no_report(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2] / "examples" / "swe-smith"
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "image_preflight", "scan", str(root / "train.jsonl"), str(root / "val.jsonl"),
               "--template", str(root / "job.yaml"), "--inventory", str(root / "nodes.json"), "--report", str(report)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before the first line, as `| head -0` would be
    stderr = process.stderr.read().decode()
    process.wait(timeout=60)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert process.returncode == 1
    assert json.loads(report.read_text())["dropped"]


@pytest.mark.parametrize("order", [(0.0, -0.0), (-0.0, 0.0)], ids=["zero-first", "minus-zero-first"])
def test_values_equal_in_python_but_printed_differently_are_judged_apart(order):
    """Jinja prints str(value): 0.0 renders "0.0:openai" (held here), -0.0 renders "-0.0:openai"
    (not a valid reference). Whichever comes first, each row gets its own verdict."""
    inventory = Inventory((NodeImages.from_names("n1", ["docker.io/library/0.0:openai"]),))
    rows = [{"image_name": value} for value in order]
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=inventory)
    assert [r["image_name"] for r in kept] == [0.0] and repr(kept[0]["image_name"]) == "0.0"
    assert [(repr(row["image_name"]), verdict.reason) for _, row, verdict in dropped] == [("-0.0", "invalid")]


def test_nan_and_infinity_render_as_agent_lightning_receives_them():
    """agentlightning/verl/agl_rollout_manager.py, _create_rollouts: RolloutCreate.model_dump(
    mode="json") writes NaN and ±inf as null (pydantic v2), so the controller's template prints
    None: "None:openai", not a valid reference, where the dataset holds nan."""
    inventory = Inventory((NodeImages.from_names("n1", ["docker.io/library/nan:openai"]),))
    rows = [{"image_name": float("nan")}, {"image_name": float("-inf")}, {"image_name": "nan"}]
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=inventory)
    assert kept == [rows[2]]
    assert [(index, verdict.reason, verdict.images) for index, _, verdict in dropped] == [
        (0, "invalid", ("None:openai",)), (1, "invalid", ("None:openai",))]


# --- agent-lightning's own template ---------------------------------------------------------------

AGL_TEMPLATE = REPO / "tests/data/agent-lightning/job-template-openai.yaml"


def test_a_row_lacking_a_text_only_field_is_kept_and_counted_as_agent_lightning_runs_it(work, capsys):
    """agentlightning/controller/k8s_reconciler.py, build_job_spec: a plain jinja2.Environment
    prints a missing `problem_statement` as "" and the Job runs; a missing `image_name` gives the
    image ":openai", which never runs."""
    from tests.builders.rows import controller_render

    template = AGL_TEMPLATE.read_text()
    rows = [{"instance_id": "a", "image_name": "good", "problem_statement": "fix it"},
            {"instance_id": "b", "image_name": "good"},
            {"instance_id": "c", "image_name": "other"},
            {"instance_id": "d", "problem_statement": "fix it"}]
    agent = controller_render(template, rows[1])["spec"]["template"]["spec"]["containers"][0]
    assert agent["env"][0] == {"name": "AGL_TASK_INPUT", "value": ""} and agent["image"] == "good:openai"
    write_jsonl(work / "train.jsonl", rows)
    assert main(["scan", "train.jsonl", "--template", str(AGL_TEMPLATE), "--inventory", "nodes.json",
                 "--report", "report.json"]) == 0
    (file,) = json.loads((work / "report.json").read_text())["files"]
    assert (file["rows"], file["kept"], file["dropped"]["unrenderable"]) == (4, 3, 1)
    assert file["kept_lacking"] == {"input.problem_statement": 2}
    assert "kept 2 row(s) of train.jsonl lacking input.problem_statement" in capsys.readouterr().out


def test_a_parquet_file_without_a_text_only_column_is_kept_and_counted(work, capsys):
    """In parquet a row cannot lack one field (a column holds null, which prints "None"); a file
    without the column lacks it in every row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"instance_id": "a", "image_name": "good"}, {"instance_id": "b", "image_name": "good"},
            {"instance_id": "c", "image_name": "lost"}]
    pq.write_table(pa.Table.from_pylist(rows), work / "train.parquet")
    assert main(["scan", "train.parquet", "--template", str(AGL_TEMPLATE), "--inventory", "nodes.json",
                 "--report", "report.json"]) == 0
    (file,) = json.loads((work / "report.json").read_text())["files"]
    assert (file["kept"], file["dropped"]["missing"], file["kept_lacking"]) == (2, 1, {"input.problem_statement": 2})


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_progress_knows_the_total_before_the_rows_are_done(work, suffix):
    """A parquet footer gives the row count before a row is read; a JSONL file's is known once
    read. Progress then grows row group by row group, never past the total."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES
    from image_preflight.core.rows.judge import RowJudge, make_template
    from image_preflight.files.inventory import load_inventory_file
    from image_preflight.scanner.scan import scan

    rows = [{"instance_id": f"i{n}", "image_name": ("good", "lost", "other")[n % 3] + str(n % 700)}
            for n in range(5000)]
    path = work / f"train.{suffix}"
    if suffix == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    else:
        write_jsonl(path, rows)
    events = []

    class Recorder:
        def add_total(self, n):
            events.append(("total", n))

        def advance(self, n):
            events.append(("advance", n))

    judge = RowJudge(make_template(None, IMAGE),
                     load_inventory_file(work / "nodes.json", max_images=DEFAULT_MAX_IMAGES))
    scan([path], judge, progress=Recorder())
    assert events[0] == ("total", 5000)
    advances = [n for kind, n in events if kind == "advance"]
    assert sum(advances) == 5000 and len(advances) > 2


def test_a_node_list_longer_than_the_cap_is_called_proof_that_the_flag_is_wrong(work, capsys):
    images = ["good:openai"] + [f"filler-{n}:v1" for n in range(59)]
    write_nodes(work / "long.json", kube_node("node-long", library_images(*images)))
    write_jsonl(work / "train.jsonl", rows_of("good", "lost"))
    assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "long.json"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: node node-long lists more images than the cap of 50 in force" in out
    assert "pass --max-images" in out


@pytest.mark.parametrize(("rows", "said"), [(["lost", "lost", "good"], True), (["good"] * 10 + ["lost"], False)])
def test_many_rows_unknown_through_caps_end_with_one_line_saying_why(work, capsys, rows, said):
    images = ["good:openai"] + [f"filler-{n}:v1" for n in range(49)]  # exactly at the cap
    write_nodes(work / "capped.json", kube_node("node-capped", library_images(*images)))
    write_jsonl(work / "train.jsonl", rows_of(*rows))
    assert main(["scan", "train.jsonl", "--image", IMAGE, "--inventory", "capped.json"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("are unknown because the kubelets list at most nodeStatusMaxImages" in out) is said
    if said:
        assert "2 of 3 rows (67%)" in out and "--max-images -1" in out
