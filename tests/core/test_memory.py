"""image_preflight.core.decide.memory: what a decision remembers, its limits and when it forgets."""

import math

from tests.builders.inventories import NOW, SWE, inv, node
from image_preflight.core.decide import memory
from image_preflight.core.decide.decision import decide, eligible_nodes
from image_preflight.core.decide.memory import Memory
from image_preflight.core.decide.scheduling import PodPlacement

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
    find = lambda: calls.append(1) or ("nodes", "reasons")  # noqa: E731
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
        remembered.decision(spec, "Pod", "all", NOW, lambda: index)
    assert len(remembered.decisions) == 1
    assert remembered.decision({"containers": [{"name": "a", "image": "img-0:1"}]}, "Pod", "all", NOW,
                               lambda: "afresh") == "afresh"


def test_a_decision_holds_between_the_lease_ends_around_it():
    remembered = Memory([NOW + 60, NOW - 10, NOW + 120])
    assert remembered.window(NOW) == (NOW - 10, NOW + 60)
    assert remembered.window(NOW + 60) == (NOW + 60, NOW + 120)  # a lease ending at `now` is over
    assert remembered.window(NOW - 20) == (-math.inf, NOW - 10)
    assert remembered.window(NOW + 500) == (NOW + 120, math.inf)
    assert remembered.window(None) == (-math.inf, math.inf)
    calls = []
    for now in (NOW, NOW + 59, NOW + 60, NOW - 11):
        remembered.decision(SPEC, "Pod", "all", now, lambda: calls.append(now))
    assert calls == [NOW, NOW + 60, NOW - 11]


def test_eligible_nodes_come_from_the_inventorys_memory():
    inventory = inv(node("n1", SWE, labels={"pool": "cpu"}), node("n2", SWE, labels={"pool": "gpu"}))
    found = eligible_nodes(_placement("cpu"), inventory)
    assert inventory.memory.placements == {_placement("cpu"): found}
    assert eligible_nodes(_placement("cpu"), inventory) is found
