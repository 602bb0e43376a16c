"""The fleet benchmark's harness (benchmarks/fleet.py) at a size CI carries: 300 nodes x 5,000
images, nodes created through the API and kept Ready by the control plane's heartbeat (KWOK is
the benchmark's, at 1,000 and 5,000 nodes: docs/benchmarks.md). Its figures are held to what the
published form must keep at any size, each against a baseline measured in the same run: a
renewal round a small fraction of writing the lists, the bytes etcd stores for a node's list and Lease within the
share of the quota that 5,000 nodes may take, serve holding every list and deciding by it, the
webhook's call as the apiserver's spans time it on the fleet against the same on 3 nodes, and the
commands a user runs against the whole cluster reading every list."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.fleet import run
from tests.controlplane.cluster import require_control_plane

NODES = 300
IMAGES = 5000
# docs/benchmarks.md: at most 200 MiB of etcd for 5,000 nodes' lists of 5,000 images.
LIVE_BYTES_PER_NODE = 200 * 2**20 / 5000
CALL_RATIO = 1.5


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> dict:
    require_control_plane()
    args = argparse.Namespace(form="hashes", nodes=NODES, images=IMAGES, catalogue=4 * IMAGES, zipf=2.0,
                              digests=False, workers=4, pods_per_node=0, idle=5.0, round_deadline=300.0,
                              max_apiserver_gib=4.0, no_kwok=True, kwok_lease=40, lease=300, serve=True, spans=15.0,
                              commands=True, seed=1)
    return run(args, tmp_path_factory.mktemp("fleet"))


def test_every_list_is_written_then_renewed_through_its_lease(fleet):
    create, renew = fleet["rounds"]["create"], fleet["rounds"]["renew"]
    assert (create["written"], create["failures"], create["reasons"]) == (NODES, 0, {"create": NODES})
    assert (renew["written"], renew["failures"], renew["reasons"]) == (NODES, 0, {"renew": NODES})
    # KEP-589's lesson: a renewal writes a Lease, not the list again.
    assert renew["apiserver_received_bytes"] <= 0.05 * create["apiserver_received_bytes"], fleet["rounds"]
    found = fleet["differences"]
    assert found["etcd in use, round 2 (one renewal each)"] <= 0.1 * found["etcd in use, round 1 (the lists written)"]


def test_the_lists_stored_bytes_fit_five_thousand_nodes_in_a_tenth_of_etcds_quota(fleet):
    # What etcd stores for one node (its list and its Lease), read back by key. etcd's in-use size
    # moves with bbolt's pages and the heartbeats beside the lists: at 100 nodes it said 49 KB a
    # node on one machine and under 42 KB on another.
    stored = {o["key"].split("/")[2]: o["etcd_value_bytes"] for o in fleet["object"]["objects"]}
    assert set(stored) == {"image-preflight.io", "leases"}, fleet["object"]
    assert 0 < sum(stored.values()) <= LIVE_BYTES_PER_NODE, stored


def test_serve_holds_every_list_and_decides_by_it(fleet):
    serve = fleet["serve"]
    assert "failed" not in serve, serve
    assert serve["inventory_nodes"] == NODES and serve["inventory_images"] == serve["names_written"]
    assert serve["admits_an_image_every_node_holds"] is True and serve["denies_an_image_no_node_holds"] is True
    assert serve["change_to_decision_s"] is not None  # an image built on one node admitted once published


def test_the_apiserver_calls_the_webhook_for_every_judged_job_no_slower_than_on_three_nodes(fleet):
    spans = fleet["spans"]
    for sample in (spans["baseline"], spans["fleet"]):
        assert sample["answers"]["failed"] == 0 and sample["answers"]["admitted"] > 0, sample
        # one span for each Job judged, by each webhook
        assert sample["calls"] == sample["judged_jobs"] == sample["reference_calls"] == sample["reference_jobs"] > 0, \
            sample
        # serve's own count of what it answered, and the time that took, which the call's span includes
        assert sample["serve_answered"] == sample["judged_jobs"], sample
        assert sample["reference_answered"] == sample["reference_jobs"], sample
        assert 0 < sample["serve_mean_s"] <= sample["webhook_p99_s"], sample
    # docs/benchmarks.md: the call on the fleet against the reference's on 3 nodes at the same
    # moments; here with room for a shared machine.
    fleet_spans = spans["fleet"]
    assert fleet_spans["webhook_p50_s"] <= CALL_RATIO * fleet_spans["reference_p50_s"], fleet_spans


def test_dump_scan_and_doctor_read_every_list_of_the_fleet(fleet):
    commands = fleet["commands"]
    dump, scan, offline = commands["inventory dump"], commands["scan"], commands["scan --inventory"]
    assert dump["exit"] == 0 and f"{NODES} nodes, {NODES} NodeImages ({NODES} renewed by their Lease)" in \
        dump["last_line"], dump
    # The same rows kept from the cluster as from its dump.
    assert scan["exit"] == offline["exit"] == 0 and scan["last_line"] == offline["last_line"], commands
    assert "kept rows" in scan["last_line"], scan
    assert commands["doctor"]["exit"] in (0, 1), commands["doctor"]  # it could check: 2 means it could not
