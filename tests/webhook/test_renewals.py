"""The Leases that renew hashed lists, as serve's LiveInventory takes them: every renewal counts,
and those that come together are published together, at most RENEWALS_WITHIN_S late. Published
one by one, each would build a new inventory (3 ms at 5,000 nodes), and every node renews once a
renewal period (docs/benchmarks.md, "At fleet scale"). A renewal changes one node's list alone,
and the decisions remembered stay where they still hold."""

from __future__ import annotations

import time

from image_preflight.core.sources.runtime_lists import AGENT_NAMESPACE, lease_object
from image_preflight.webhook.live_inventory import RENEWALS_WITHIN_S, LiveInventory
from image_preflight.core.decide.decision import decide
from tests.builders.inventories import SWE, pod
from tests.builders.nodes import OBSERVED, kube_node, runtime

NODES = [f"worker-{n}" for n in range(1, 4)]
LEASE = 300


def renewal(node: str, at: float) -> dict:
    return lease_object(node, AGENT_NAMESPACE, renewed_at=at, lease_seconds=LEASE)


def live_inventory() -> LiveInventory:
    live = LiveInventory(max_images=-1)
    live.replace_nodes(kube_node(node) for node in NODES)
    live.replace_runtime_objects(runtime(node, lease=LEASE) for node in NODES)
    live.replace_renewals(iter(()))
    return live


def test_renewals_that_come_together_are_published_once_and_within_their_bound():
    live = live_inventory()
    before = live.current
    decide(pod(SWE), before, now=OBSERVED + 10)
    start = time.monotonic()
    for node in NODES:
        live.upsert_renewal(renewal(node, OBSERVED + 100))
    assert live.current is before  # not yet: one publish for the three
    while live.current is before:
        assert time.monotonic() - start < RENEWALS_WITHIN_S + 1.0, "the renewals never reached the decisions"
        time.sleep(0.01)
    published = live.current
    assert [published.get(node).expires_at for node in NODES] == [OBSERVED + 100 + LEASE] * len(NODES)
    assert published.decisions.keys() == before.decisions.keys() != set()  # still true: kept
    time.sleep(RENEWALS_WITHIN_S + 0.2)
    assert live.current is published  # and only once


def test_a_lease_that_renews_nothing_or_is_deleted_stops_counting_at_once():
    live = live_inventory()
    live.replace_renewals([renewal("worker-1", OBSERVED + 100)])
    assert live.current.get("worker-1").expires_at == OBSERVED + 100 + LEASE
    held_elsewhere = renewal("worker-1", OBSERVED + 200)
    held_elsewhere["spec"]["holderIdentity"] = "worker-2"
    live.upsert_renewal(held_elsewhere)
    assert live.current.get("worker-1").expires_at == OBSERVED + LEASE
    live.replace_renewals([renewal("worker-1", OBSERVED + 100)])
    live.delete_renewal(renewal("worker-1", OBSERVED + 100))
    assert live.current.get("worker-1").expires_at == OBSERVED + LEASE


def test_a_heartbeat_that_changes_nothing_a_decision_reads_keeps_the_inventory_and_its_decisions():
    live = live_inventory()
    before = live.current
    live.upsert_node(kube_node("worker-1"))  # the kubelet's status update: only its time is new
    assert live.current is before
    live.upsert_node(kube_node("worker-1", taints=[{"key": "gpu", "effect": "NoSchedule"}]))
    assert live.current is not before and live.current.get("worker-1").traits != before.get("worker-1").traits
