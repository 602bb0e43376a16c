"""What `scan` prints, as a user reads it: a table at 80 columns that cuts no name, plain lines when
piped, one row numbering, rows kept unconfirmed counted and said, why a row is unknown, one form
for the image lists, and bad values refused in one line."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from image_preflight import filter_rows, load_inventory
from image_preflight.cli import main
from image_preflight.core.decide.inventory import Inventory, NodeImages

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "swe-smith"
README_SCAN = ["scan", "examples/swe-smith/train.jsonl", "examples/swe-smith/val.jsonl",
               "--template", "examples/swe-smith/job.yaml", "--inventory", "examples/swe-smith/nodes.json"]
IMAGE = "{{ input.image_name }}:openai"
KINDS = ("scanned ", "missing image ", "dropped ", "kept unconfirmed ", "... and ", "kept ", "wrote ", "warning: ")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | (env or {})
    return subprocess.run([sys.executable, "-m", "image_preflight", *args], capture_output=True, text=True,
                          cwd=REPO, env=environment, timeout=120)


def _in_terminal(*args: str, columns: int = 80) -> list[str]:
    """stdout of the command run on a terminal `columns` wide (a pty, as a user's shell gives it)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    process = subprocess.Popen([sys.executable, "-m", "image_preflight", *args], stdin=follower, stdout=follower,
                               stderr=subprocess.DEVNULL, cwd=REPO, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError as exc:  # EIO: the terminal's other end closed
            if exc.errno != errno.EIO:
                raise
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=120) == 0
    return b"".join(chunks).decode().replace("\r\n", "\n").splitlines()


def _names() -> tuple[list[str], list[str]]:
    """The README scan's file names, and the images it reports missing, as the runtime names them."""
    files = ["examples/swe-smith/train.jsonl", "examples/swe-smith/val.jsonl"]
    images = [f"docker.io/jyangballin/swesmith.x86_64.{name}:openai" for name in (
        "mahmoud_1776_glom.fb3c4e76", "getmoto_1776_moto.694ce1f4", "cookiecutter_1776_cookiecutter.b4451231")]
    return files, images


def test_on_an_80_column_terminal_the_tables_cut_no_name_or_header():
    lines = _in_terminal(*README_SCAN, columns=80)
    files, images = _names()
    header = lines[0].split()
    assert header == ["ROWS", "KEPT", "DROPPED", "MISSING", "UNRENDERABLE", "FILE"], lines[0]
    assert {line.split()[-1]: line.split()[:-1] for line in lines[1:3]} == {
        files[0]: ["40", "23", "17", "17", "0"], files[1]: ["12", "8", "4", "3", "1"]}
    for name in files + images:  # each whole on one line
        assert any(name in line for line in lines), name
    assert not any("…" in line or "┃" in line or "│" in line for line in lines)
    for line in lines[:3]:
        assert len(line) <= 80, line
    table = lines[lines.index("ROWS  MISSING IMAGE (build or load it on the node)"):][1:4]
    # A row wider than the terminal holds one name too long for the room, whole: the terminal wraps it.
    assert all(len(line) <= 80 or len(line.split()[-1]) > 80 - len("ROWS  ") for line in table), table


def test_a_narrow_terminal_gets_the_plain_lines_rather_than_a_cut_table():
    lines = _in_terminal(*README_SCAN, columns=40)
    files, _ = _names()
    assert lines[:2] == [f"scanned {files[0]}: rows 40, kept 23, dropped 17 (missing 17)",
                         f"scanned {files[1]}: rows 12, kept 8, dropped 4 (missing 3, unrenderable 1)"]


def test_piped_the_scan_prints_one_plain_record_a_line():
    done = _cli(*README_SCAN)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "\x1b" not in done.stdout and not re.search("[\u2500-\u257f…]", done.stdout)  # no escapes, no boxes
    assert all(line == line.strip() and "  " not in line for line in lines), lines  # no padding
    assert all(line.startswith(KINDS) for line in lines), [line for line in lines if not line.startswith(KINDS)]
    files, images = _names()
    assert [line for line in lines if line.startswith("missing image ")] == [
        f"missing image {images[0]}: 8 rows", f"missing image {images[1]}: 6 rows",
        f"missing image {images[2]}: 6 rows"]
    # One long line is one line: a reason is never wrapped onto the next.
    assert f"dropped {files[0]} row 3: missing: {images[0].removeprefix('docker.io/')} (not on cpu-node-1)" in lines
    assert _cli(*README_SCAN, env={"NO_COLOR": "1"}).stdout == done.stdout


def test_output_json_prints_the_report(tmp_path):
    report = tmp_path / "report.json"
    done = _cli(*README_SCAN, "--output", "json", "--report", str(report))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(report.read_text())
    assert set(json.loads(done.stdout)) == {"files", "dropped", "kept_unconfirmed", "missing_images"}


def test_rows_are_numbered_from_0_alike_on_stdout_in_the_report_and_by_the_api(tmp_path):
    rows = [{"image_name": "held"}, {"image_name": "gone"}, {"image_name": "held"}, {"image_name": "gone"}]
    (tmp_path / "nodes.txt").write_text("held:openai\n")
    (tmp_path / "d.jsonl").write_text("\n" + "".join(json.dumps(r) + "\n\n" for r in rows))  # blank lines: no rows
    (tmp_path / "d.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    report = tmp_path / "report.json"
    done = _cli("scan", *(str(tmp_path / f"d.{ext}") for ext in ("jsonl", "json", "parquet")), "--image", IMAGE,
                "--inventory", str(tmp_path / "nodes.txt"), "--report", str(report))
    assert done.returncode == 0, done.stderr
    _, api = filter_rows(rows, image=IMAGE, inventory=load_inventory(tmp_path / "nodes.txt"))
    assert [index for index, _, _ in api] == [1, 3]
    for ext in ("jsonl", "json", "parquet"):
        name = str(tmp_path / f"d.{ext}")
        assert [d["row"] for d in json.loads(report.read_text())["dropped"] if d["file"] == name] == [1, 3]
        assert [line.split(": ")[0] for line in done.stdout.splitlines() if line.startswith(f"dropped {name} ")] == [
            f"dropped {name} row 1", f"dropped {name} row 3"]


def test_keep_unknown_counts_and_reports_the_rows_it_kept_unconfirmed(tmp_path):
    """A node listing 8 images against a cap of 5: absent images are unknown, never missing."""
    report = tmp_path / "report.json"
    done = _cli("scan", "examples/swe-smith/train.jsonl", "--template", "examples/swe-smith/job.yaml",
                "--inventory", "examples/swe-smith/nodes.json", "--max-images", "5", "--keep-unknown",
                "--report", str(report))
    assert done.returncode == 0, done.stderr
    files, _ = _names()
    assert done.stdout.splitlines()[0] == f"scanned {files[0]}: rows 40, kept 40 (17 unconfirmed), dropped 0"
    written = json.loads(report.read_text())
    assert written["files"][0]["kept"] == 40 and written["files"][0]["kept_unconfirmed"] == 17
    assert len(written["kept_unconfirmed"]) == 17 and written["dropped"] == []
    assert {d["reason"] for d in written["kept_unconfirmed"]} == {"unknown"}
    assert {d["detail"] for d in written["kept_unconfirmed"]} == {"cpu-node-1: list capped by nodeStatusMaxImages"}
    kept = [line for line in done.stdout.splitlines() if line.startswith("kept unconfirmed ")]
    assert len(kept) == 17 and kept[0].endswith("(cpu-node-1: list capped by nodeStatusMaxImages)")


NOW = 1_000_000.0


@pytest.mark.parametrize(("node", "spec", "because"), [
    (NodeImages.from_names("cpu-1", ["other:1"], complete=False, capped=True), {},
     "cpu-1: list capped by nodeStatusMaxImages"),
    (NodeImages.from_names("cpu-1", ["other:1"], observed_at=NOW - 600, expires_at=NOW - 300, source="cri"), {},
     "cpu-1: list's lease ran out"),
    (NodeImages.from_names("cpu-1", ["other:1"], observed_at=NOW + 600, expires_at=NOW + 900, source="cri"), {},
     "cpu-1: list observed ahead of this clock"),
    (NodeImages.from_names("cpu-1", ["other:1"]), {"runtimeClassName": "gvisor"},
     "RuntimeClass 'gvisor' is not in the inventory"),
])
def test_every_unknown_row_says_why(node, spec, because):
    from image_preflight.api import filter_rows as judge_rows

    template = ("apiVersion: batch/v1\nkind: Job\nmetadata: {name: r}\nspec:\n  template:\n    spec:\n"
                + "".join(f"      {key}: {value}\n" for key, value in spec.items())
                + "      restartPolicy: Never\n      containers:\n      - name: c\n"
                "        image: '{{ input.image_name }}:openai'\n        imagePullPolicy: IfNotPresent\n")
    _, dropped = judge_rows([{"image_name": "app"}], template=template, inventory=Inventory((node,)), now=NOW)
    ((_, _, verdict),) = dropped
    assert (verdict.reason, verdict.detail) == ("unknown", because)


def test_the_build_list_and_the_pin_list_name_an_image_one_way(tmp_path):
    """Two spellings of one image are one line, as the runtime names it, in both lists."""
    (tmp_path / "nodes.txt").write_text("held:openai\n")
    rows = [{"image_name": "held"}, {"image_name": "docker.io/library/held"},
            {"image_name": "gone"}, {"image_name": "docker.io/library/gone"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _cli("scan", str(tmp_path / "d.jsonl"), "--image", IMAGE, "--inventory", str(tmp_path / "nodes.txt"),
                "--missing-images", str(tmp_path / "build.txt"), "--needed-images", str(tmp_path / "pin.txt"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "build.txt").read_text() == "docker.io/library/gone:openai\n"
    assert (tmp_path / "pin.txt").read_text() == "docker.io/library/held:openai\n"
    assert "missing image docker.io/library/gone:openai: 2 rows" in done.stdout.splitlines()


@pytest.mark.parametrize("command", [
    ["scan", "examples/swe-smith/train.jsonl", "--image", IMAGE, "--inventory", "examples/swe-smith/nodes.json"],
    ["serve", "--tls-cert", "c", "--tls-key", "k"],
    ["doctor"],
])
def test_a_max_images_below_minus_1_is_refused_in_one_line(command, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main([*command, "--max-images", "-5"]) == 2
    assert capsys.readouterr().err == f"image-preflight {command[0]}: --max-images -5: must be -1 (no cap) or more\n"


def test_a_json_inventory_that_is_not_json_is_said_to_be_not_json(tmp_path, capsys):
    (tmp_path / "nodes.json").write_text("this is {not json\n")
    assert main(["scan", str(EXAMPLE / "train.jsonl"), "--image", IMAGE,
                 "--inventory", str(tmp_path / "nodes.json")]) == 2
    assert capsys.readouterr().err == (f"image-preflight scan: {tmp_path / 'nodes.json'}: not JSON (a .json snapshot "
                                       "starts with { or [), found 'this is {not json'\n")
