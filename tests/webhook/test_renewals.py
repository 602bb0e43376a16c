"""The Leases that renew hashed lists, as serve's LiveInventory takes them: every renewal counts,
and those that come together are published together, at most RENEWALS_WITHIN_S late. Published
one by one, each would build a new inventory (0.5 ms at 5,000 nodes), and every node renews once a
renewal period (docs/benchmarks.md, "At fleet scale"). A renewal changes one node's list alone,
and the decisions remembered stay where they still hold."""

from __future__ import annotations

import random
import time
from dataclasses import replace

from image_preflight.core.decide.decision import decide
from image_preflight.core.sources.runtime_lists import AGENT_NAMESPACE, lease_object
from image_preflight.webhook.live_inventory import RENEWALS_WITHIN_S, LiveInventory
from tests.builders.inventories import SWE, pod
from tests.builders.nodes import OBSERVED, RUNTIME_IMAGES, kube_node, runtime, status_image

NODES = [f"worker-{n}" for n in range(1, 4)]
LEASE = 300
TIMES = [OBSERVED + offset for offset in (10, 100, 280, 320)]  # in and around the leases below


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
    assert live.published == {"relist": 3, "node": 0, "node-images": 0, "lease": 1, "runtime-class": 0}
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
    assert live.current is before and live.published["node"] == 0
    live.upsert_node(kube_node("worker-1", taints=[{"key": "gpu", "effect": "NoSchedule"}]))
    assert live.current is not before and live.current.get("worker-1").traits != before.get("worker-1").traits
    assert live.published["node"] == 1  # what serve's /metrics counts (image_preflight_inventory_publications)


def test_a_live_inventory_changed_one_node_at_a_time_is_the_one_published_afresh(monkeypatch):
    """Nodes, their agents' lists and Leases come, change and go in a random order: after each,
    serve's inventory, published one node at a time, holds what one published from all the same
    objects at once holds, and decides alike."""
    from image_preflight.webhook import live_inventory

    monkeypatch.setattr(live_inventory, "RENEWALS_WITHIN_S", 0.001)
    rng = random.Random(589)
    names = [f"worker-{n}" for n in range(1, 6)]
    world: dict[str, dict[str, dict]] = {"nodes": {}, "lists": {}, "leases": {}}
    live = LiveInventory(max_images=-1)
    live.replace_nodes(())
    live.replace_runtime_objects(())
    live.replace_renewals(())
    specs = [pod(SWE), pod(SWE, nodeSelector={"pool": "a"}), pod("docker.io/library/python:3.11")]
    changes = {  # what is in the cluster: how each kind is made, and how serve hears it came and went
        "nodes": (lambda name: kube_node(name, [status_image("docker.io/library/python", "3.11")] * rng.randint(0, 1),
                                         labels={"pool": rng.choice("ab")}), live.upsert_node, live.delete_node),
        "lists": (lambda name: runtime(name, images=RUNTIME_IMAGES[:rng.randint(1, 3)],
                                       observed_at=OBSERVED + rng.choice((-400, 0))),
                  live.upsert_runtime, live.delete_runtime),
        "leases": (lambda name: renewal(name, OBSERVED + rng.choice((-200, 50, 150))),
                   live.upsert_renewal, lambda name: live.delete_renewal(renewal(name, OBSERVED))),
    }
    for _ in range(600):
        for now in TIMES:
            for spec in specs:
                decide(spec, live.current, now=now)  # remembered, and carried through a renewal
        name, (kind, (made, upsert, delete)) = rng.choice(names), rng.choice(list(changes.items()))
        if rng.random() < 0.5:
            world[kind][name] = made(name)
            upsert(world[kind][name])
        else:
            world[kind].pop(name, None)
            delete(name)
        afresh = LiveInventory(max_images=-1)
        afresh.replace_nodes(world["nodes"].values())
        afresh.replace_runtime_objects(world["lists"].values())
        afresh.replace_renewals(world["leases"].values())
        deadline = time.monotonic() + 2.0
        while _lists(live.current) != _lists(afresh.current):  # a renewal is published a moment later
            assert time.monotonic() < deadline, (_lists(live.current), _lists(afresh.current))
            time.sleep(0.002)
        for now in TIMES:
            for spec in specs:
                assert decide(spec, live.current, now=now) == decide(spec, afresh.current, now=now)


def _lists(inventory) -> dict:
    """Each node's list, less the time a status list was read (that is when it was converted)."""
    return {item.node: replace(item, observed_at=None) if item.expires_at is None else item
            for item in inventory.nodes}
