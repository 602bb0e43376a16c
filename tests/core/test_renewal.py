"""A hashed list renewed by its node's Lease (KEP-589's lesson: a heartbeat apart from the data):
which Lease counts, what a renewal extends, and every reader that joins the two (a snapshot, the
watchdog's sandbox check, doctor) the same way."""

from __future__ import annotations

import json

import pytest

from image_preflight.core.doctor.findings import OK, node_lists
from image_preflight.core.sources.runtime_lists import (
    AGENT_NAMESPACE,
    format_micro_time,
    lease_object,
    node_images_from_runtime,
    renewal,
    renewed,
)
from image_preflight.core.sources.snapshots import SnapshotError, load_snapshot
from image_preflight.core.watchdog.pull_failures import sandbox_unconfirmed
from tests.builders.nodes import OBSERVED, kube_node, runtime

LEASE = 300


def lease(node: str = "worker-1", at: float = OBSERVED + 1000, holder: str | None = None) -> dict:
    obj = lease_object(node, AGENT_NAMESPACE, renewed_at=at, lease_seconds=LEASE)
    if holder is not None:
        obj["spec"]["holderIdentity"] = holder
    return obj


def test_a_lease_renews_the_list_of_the_node_it_is_named_after_and_held_by():
    assert renewal(lease()) == ("worker-1", OBSERVED + 1000)
    assert format_micro_time(OBSERVED + 0.25).endswith(".250000Z")  # a MicroTime, as the apiserver parses it
    for other in (lease(holder="worker-2"), lease(holder=""), {"metadata": {"name": "worker-1"}},
                  {**lease(), "spec": {**lease()["spec"], "renewTime": "yesterday"}}, None, "worker-1"):
        assert renewal(other) is None


def test_a_renewal_starts_the_lists_lease_again_and_an_earlier_one_changes_nothing():
    listed = node_images_from_runtime(runtime(lease=LEASE))
    assert not listed.current(OBSERVED + 1000)
    later = renewed(listed, OBSERVED + 1000)
    assert later.current(OBSERVED + 1000 + LEASE - 1) and not later.current(OBSERVED + 1000 + LEASE)
    assert later.refs == listed.refs and later.sandbox_missing == listed.sandbox_missing
    assert renewed(listed, OBSERVED - 10) is listed and renewed(listed, None) is listed
    # A renewal far ahead of the reader's clock keeps nothing current (CLOCK_SKEW_S), as observedAt.
    assert not renewed(listed, OBSERVED + 10_000).current(OBSERVED + 1000)


def test_a_snapshot_joins_each_list_with_its_lease():
    def loaded(*items):
        return load_snapshot(json.dumps({"kind": "List", "items": list(items)}), source="dump.json")

    node = loaded(kube_node("worker-1"), runtime(), lease()).get("worker-1")
    assert node.source == "cri" and node.expires_at == OBSERVED + 1000 + LEASE
    with pytest.raises(SnapshotError, match=r"^dump\.json: items\[2\]: a Lease that renews no node's list"):
        loaded(kube_node("worker-1"), runtime(), lease(holder="worker-2"))


def test_the_watchdog_and_doctor_take_the_renewal_too():
    spec = runtime(lease=LEASE)
    spec["spec"]["sandboxImage"] = {"name": "registry.k8s.io/pause:3.10", "present": False}
    now = OBSERVED + 1000
    assert sandbox_unconfirmed(spec, "worker-1", "registry.k8s.io/pause:3.10", now).startswith(
        "node worker-1's NodeImages is not current")
    assert sandbox_unconfirmed(spec, "worker-1", "registry.k8s.io/pause:3.10", now, renewed_at=now - 10) is None
    found = node_lists([kube_node("worker-1")], [spec], {}, 50, now, [lease(at=now - 10)])
    assert found[0].status == OK and "complete list from the node agent" in found[0].text
    stale = node_lists([kube_node("worker-1")], [spec], {}, 50, now, [])
    assert stale[0].status != OK
