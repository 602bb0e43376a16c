"""image_preflight.core.decide.memory: what a decision remembers, its limits and when it forgets."""

import math
import random
from dataclasses import replace

from image_preflight.core.decide import memory
from image_preflight.core.decide.decision import FOR_EVER, decide, eligible_nodes
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.decide.memory import Memory
from image_preflight.core.decide.scheduling import PodPlacement
from image_preflight.core.sources.runtime_lists import renewed
from tests.builders.inventories import NOW, SWE, inv, node, pod

SPEC = {"containers": [{"name": "agent", "image": SWE, "imagePullPolicy": "IfNotPresent"}]}


def _placement(value: str) -> PodPlacement:
    return PodPlacement.from_pod_spec({"nodeSelector": {"pool": value}})


def test_each_inventory_holds_its_own_memory_and_a_new_one_starts_empty():
    first = inv(node("n1", SWE))
    decide(SPEC, first, now=NOW)
    assert len(first.memory.decisions) == 1 and len(first.memory.placements) == 1
    second = first.merged([])
    assert second.memory is not first.memory and second.memory.decisions == {} == second.memory.placements
    assert first.decisions is first.memory.decisions


def test_a_placement_is_found_once_and_a_freak_one_every_time():
    remembered, calls = Memory(), []

    def find():
        calls.append(1)
        return "nodes", "reasons"

    assert remembered.placement(_placement("cpu"), find) == remembered.placement(_placement("cpu"), find)
    assert len(calls) == 1
    freak = _placement("x" * (memory.PLACEMENT_CHARACTERS + 1))
    remembered.placement(freak, find), remembered.placement(freak, find)
    assert len(calls) == 3 and freak not in remembered.placements


def test_placements_are_forgotten_all_at_once_when_full():
    remembered = Memory()
    for index in range(memory.PLACEMENTS):
        remembered.placement(_placement(str(index)), lambda: ([], None))
    assert len(remembered.placements) == memory.PLACEMENTS
    remembered.placement(_placement("one more"), lambda: ([], None))
    assert list(remembered.placements) == [_placement("one more")]


def test_decisions_are_forgotten_all_at_once_when_full():
    remembered = Memory()
    for index in range(memory.DECISIONS + 1):
        spec = {"containers": [{"name": "a", "image": f"img-{index}:1"}]}
        remembered.decision(spec, "Pod", "all", NOW, lambda: (index, FOR_EVER))
    assert len(remembered.decisions) == 1
    assert remembered.decision({"containers": [{"name": "a", "image": "img-0:1"}]}, "Pod", "all", NOW,
                               lambda: ("afresh", FOR_EVER)) == "afresh"


def test_a_decision_holds_between_the_lease_ends_around_it():
    # Proving from CLOCK_SKEW_S (60 s) before each observation to its lease's end:
    # [NOW - 300, NOW + 60), [NOW - 130, NOW + 230), [NOW - 240, NOW + 120).
    lists = [node(f"n{index}", observed_at=observed, expires_at=observed + 300)
             for index, observed in enumerate((NOW - 240, NOW - 70, NOW - 180))]
    assert memory.window(lists, NOW) == (NOW - 130, NOW + 60)
    assert memory.window(lists, NOW + 60) == (NOW + 60, NOW + 120)  # a lease ending at `now` is over
    assert memory.window(lists, NOW - 400) == (-math.inf, NOW - 300)
    assert memory.window(lists, NOW + 500) == (NOW + 230, math.inf)
    assert memory.window(lists, None) == memory.window([], NOW) == FOR_EVER
    remembered, calls = Memory(), []

    def decided(now):
        calls.append(now)
        return now, memory.window(lists, now)

    for now in (NOW, NOW + 59, NOW + 60, NOW - 11):
        remembered.decision(SPEC, "Pod", "all", now, lambda: decided(now))
    assert calls == [NOW, NOW + 60, NOW - 11]


def test_a_decision_holds_as_long_as_the_clocks_of_the_lists_it_read():
    """Only the lists without a checked image (and those reporting a missing sandbox image) were
    read at `now`: at 5,000 nodes, some lease ends every few tenths of a second."""
    holders = [node(f"h{index}", SWE, observed_at=NOW - index, expires_at=NOW - index + 300) for index in range(50)]
    lacking = node("lacking", observed_at=NOW - 100, expires_at=NOW + 200)
    everywhere = inv(*holders)
    decide(SPEC, everywhere, now=NOW)
    assert [entry[1:] for entry in everywhere.decisions.values()] == [FOR_EVER]
    assert decide(SPEC, everywhere, now=NOW + 10_000) is decide(SPEC, everywhere, now=NOW)
    somewhere = inv(*holders, lacking)
    assert decide(SPEC, somewhere, now=NOW).outcome == "deny"
    assert [entry[1:] for entry in somewhere.decisions.values()] == [(NOW - 160, NOW + 200)]
    halted = inv(*holders, replace(holders[0], node="halted", sandbox_missing="pause:3.10"))
    assert decide(SPEC, halted, now=NOW).outcome == "deny"
    assert [entry[1:] for entry in halted.decisions.values()] == [(NOW - 60, NOW + 300)]
    assert decide(SPEC, halted, now=NOW + 300).outcome == "allow"  # its report ran out with its lease


def test_eligible_nodes_come_from_the_inventorys_memory():
    inventory = inv(node("n1", SWE, labels={"pool": "cpu"}), node("n2", SWE, labels={"pool": "gpu"}))
    found = eligible_nodes(_placement("cpu"), inventory)
    assert found[0] == [inventory.get("n1")]
    [(placement, eligible)] = inventory.memory.placements.items()
    assert (placement, eligible.places.tolist(), eligible.names, eligible.reasons) == (
        _placement("cpu"), [0], ("n1",), found[1])
    assert eligible_nodes(_placement("cpu"), inventory) == found
    renewed = inventory.updated({"n1": replace(inventory.get("n1"), observed_at=NOW)})
    assert renewed.memory.placements == inventory.memory.placements  # a renewal moves no node
    assert eligible_nodes(_placement("cpu"), renewed)[0] == [renewed.get("n1")]


def test_new_names_keep_the_placements_and_new_traits_or_reports_do_not():
    inventory = inv(node("n1", SWE, labels={"pool": "cpu"}), node("n2", SWE, labels={"pool": "gpu"}))
    decide(SPEC, inventory, now=NOW)
    relisted = inventory.updated({"n2": replace(inventory.get("n2"), refs=frozenset())})
    assert relisted.memory.placements == inventory.memory.placements and relisted.memory.decisions == {}
    assert decide(SPEC, relisted, now=NOW).outcome == "deny"  # n2 lacks it now
    assert inventory.updated({"n2": None}).memory.earlier == {}  # a node left: places moved, all forgotten


def test_new_traits_have_each_placement_found_again_at_the_changed_nodes_alone():
    inventory = inv(node("n1", SWE, labels={"pool": "cpu"}), node("n2", SWE, labels={"pool": "gpu"}))
    cpu = _placement("cpu")
    eligible_nodes(cpu, inventory)
    found = inventory.memory.placements[cpu]
    moved = inventory.updated({"n2": replace(inventory.get("n2"), traits=replace(inventory.get("n2").traits,
                                                                                 labels={"pool": "cpu"}))})
    assert moved.memory.placements == {} and moved.memory.earlier == {cpu: (found, frozenset({1}))}
    again = moved.updated({"n3": node("n3", SWE, labels={"pool": "gpu"}),
                           "n1": replace(moved.get("n1"), sandbox_missing="registry.k8s.io/pause:3.10")})
    assert again.memory.earlier == {cpu: (found, frozenset({0, 1, 2}))}  # since it was found: n2, n1, n3 (added)
    eligible, reasons = eligible_nodes(cpu, again)
    assert ([n.node for n in eligible], reasons) == (
        ["n1", "n2"], {"node(s) didn't match Pod's node affinity/selector": 1})
    assert again.memory.placements[cpu].reporting == (0,)
    assert eligible_nodes(cpu, again) == eligible_nodes(cpu, inv(*again.nodes))  # as found afresh
    many = inventory.updated({f"x{i}": node(f"x{i}", SWE) for i in range(memory.MOVED_PLACES + 1)})
    assert many.memory.earlier == {}  # more than MOVED_PLACES changed: found afresh


def test_what_a_renewal_leaves_remembered_decides_as_a_fresh_inventory_would():
    """A remembered decision holds only while the clocks it read do (memory.window), and
    Inventory.updated carries decisions through renewals (Memory.renewed): at any time, asked
    anything, the remembered answer is what a fresh inventory of the same lists decides."""
    rng = random.Random(589)
    specs = [pod(SWE), pod("other:1"), pod(SWE, "other:1"), pod(SWE, nodeSelector={"pool": "cpu"})]
    times = [NOW + offset for offset in (-400, -90, -30, 0, 30, 59, 60, 90, 200, 299, 300, 301, 650, 1000)]
    for _ in range(300):
        lists = [_leased(rng, f"n{index}") for index in range(rng.randint(1, 4))]
        carried = Inventory(lists)
        for _ in range(rng.randint(0, 3)):  # what the old inventory was asked, at times of its own
            for spec in specs:
                now = rng.choice(times)
                assert decide(spec, carried, now=now) == decide(spec, Inventory(lists), now=now), (lists, now)
        for _ in range(rng.randint(1, 3)):
            chosen = rng.sample(lists, rng.randint(1, len(lists)))
            renewed = {item.node: _renewed(rng, item) for item in chosen}
            carried = carried.updated(renewed)
            lists = [renewed.get(item.node, item) for item in lists]
            for now in rng.sample(times, 5):
                spec = rng.choice(specs)
                assert decide(spec, carried, now=now) == decide(spec, Inventory(lists), now=now), (lists, now)


def test_a_renewal_keeps_what_is_remembered_and_any_other_change_forgets_it():
    listed = node("n1", SWE, observed_at=NOW - 10, expires_at=NOW + 290)
    first = inv(listed, node("n2"))
    decide(SPEC, first, now=NOW)
    renewed = first.updated({"n1": replace(listed, observed_at=NOW + 5, expires_at=NOW + 305)})
    assert list(renewed.decisions.values())[0][1:] == FOR_EVER  # n1 holds the image: its clock was not read
    lacked = first.updated({"n2": node("n2", observed_at=NOW - 10, expires_at=NOW + 290)})
    assert list(lacked.decisions.values())[0][1:] == (NOW - 70, NOW + 290)  # n2's clock, read, now leased
    leased = inv(listed, node("n2", observed_at=NOW - 10, expires_at=NOW + 290))
    decide(SPEC, leased, now=NOW)
    again = leased.updated({"n2": node("n2", observed_at=NOW + 5, expires_at=NOW + 305)})
    assert list(again.decisions.values())[0][1:] == (NOW - 55, NOW + 290)  # where both of n2's leases run
    assert renewed.get("n1").expires_at == NOW + 305 and len(renewed) == 2
    for change in ({"n1": replace(listed, complete=False)}, {"n2": None}, {"n3": node("n3")}):
        assert first.updated(change).decisions == {}


def _leased(rng: random.Random, name: str) -> NodeImages:
    images = rng.sample([SWE, "other:1"], rng.randint(0, 2))
    labels = {"pool": rng.choice(["cpu", "gpu"])}
    if rng.random() < 0.2:
        return node(name, *images, labels=labels)  # no lease: proves what it says for ever
    observed = NOW + rng.choice([-700, -300, -100, 0, 100])  # stale, current, or ahead of the clock
    return node(name, *images, labels=labels, observed_at=observed, expires_at=observed + 300,
                sandbox_missing=rng.choice([None, None, "pause:3.10"]))


def _renewed(rng: random.Random, item: NodeImages) -> NodeImages:
    if item.expires_at is None:
        return item
    at = item.observed_at + rng.choice([0, 1, 50, 150, 400, 800])
    return renewed(item, at)
