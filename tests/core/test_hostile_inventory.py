"""Hostile inventories: every malformed snapshot file is a one-line InputError naming the file and
the field, and a poller goes on after any failure (tests/webhook/test_hostile_live_inventory.py has
`serve`'s file poller and live conversions)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from image_preflight.core.sources.snapshots import SnapshotError, load_snapshot
from image_preflight.errors import InputError
from image_preflight.files.inventory import load_inventory_file
from image_preflight.files.poll import Poller
from tests.builders.inventories import NOW
from tests.builders.nodes import kube_node, status_image
from tests.hostile_inventories import HOSTILE, hostile_texts, write
from tests.serving import wait_until


def assert_one_line_naming(message: str, path: Path, field: str) -> None:
    assert message.isprintable(), message  # no newline, no lone surrogate, nothing a terminal mangles
    assert len(message) <= 1000, message[:200]
    assert re.match(re.escape(str(path)) + field, message), message[:300]


# --- (a) each hostile file kind is one InputError naming the file and field ---------------------------


@pytest.mark.parametrize(("name", "content", "field"), [case[1:] for case in HOSTILE],
                         ids=[case[0] for case in HOSTILE])
def test_a_hostile_snapshot_is_one_input_error_naming_the_file_and_field(tmp_path, name, content, field):
    path = write(tmp_path / name, content)
    with pytest.raises(InputError) as raised:
        load_inventory_file(path)
    assert type(raised.value) is InputError
    assert_one_line_naming(str(raised.value), path, field)


def test_a_file_named_with_bytes_that_are_not_utf_8_cannot_name_its_node(tmp_path):
    path = write(Path(str(tmp_path / "worker") + "\udcff.json"), json.dumps({"images": []}))  # b"\xff" on disk
    with pytest.raises(InputError) as raised:
        load_inventory_file(path)
    assert raised.value.args[0].endswith(": node name (from the file's name): not valid Unicode (a lone surrogate)")
    assert str(raised.value).isprintable()


def test_valid_pairs_of_surrogate_escapes_and_ascii_digit_caps_still_read():
    node = kube_node("cpu-1", [status_image("docker.io/library/alpha", "v1")], labels={"emoji": "x"})
    node["metadata"]["annotations"] = {"note": "\U0001f600", "image-preflight.io/node-status-max-images": "²"}
    [read] = load_snapshot(json.dumps(node), source="n.json").nodes  # ensure_ascii: a surrogate pair escape
    assert read.node == "cpu-1" and read.complete


# --- (b) a structure-aware, seeded fuzz over every snapshot format -----------------------------------


def test_fuzzed_snapshots_of_every_format_read_or_are_one_line_snapshot_errors():
    read = refused = 0
    for index, (form, text) in enumerate(hostile_texts(4000, seed=20261130)):
        source = f"fuzz-{index}.json"
        try:
            inventory = load_snapshot(text, source=source, node_name="worker", observed_at=NOW)
        except SnapshotError as exc:
            refused += 1
            assert type(exc) is SnapshotError
            assert_one_line_naming(str(exc), Path(source), "")
            continue
        except Exception as exc:  # noqa: BLE001 - reported with what produced it
            pytest.fail(f"{form} #{index}: {type(exc).__name__}: {str(exc)[:200]}\n{text[:500]}")
        read += 1
        for node in inventory.nodes:  # what was read holds only strings that can be written out
            assert isinstance(node.node, str) and node.node.encode("utf-8")
            assert all(isinstance(key, str) and key.encode("utf-8") for key in [*node.refs, *node.ids])
    assert read > 200 and refused > 1000  # both sides were exercised


# --- (c) the poller goes on after any failure ------------------------------------------------------


def test_a_poller_survives_any_exception_its_poll_raises(caplog):
    calls = []

    def poll():
        calls.append(1)
        raise [ValueError("multi\nline"), KeyError("k"), RuntimeError()][len(calls) % 3]

    poller = Poller(poll, interval=0.001, name="test-poller")
    with caplog.at_level(logging.WARNING):
        thread = poller.start()
        wait_until(lambda: len(calls) >= 6, "polls go on after failures")
        poller.stop()
        thread.join(timeout=5)
    assert not thread.is_alive()
    messages = [r.getMessage() for r in caplog.records if r.name == "image_preflight.files.poll"]
    assert "test-poller: poll failed, trying again in 0.001s: ValueError: multi\\nline" in messages
    assert "test-poller: poll failed, trying again in 0.001s: RuntimeError" in messages
    assert all(m.isprintable() for m in messages)
