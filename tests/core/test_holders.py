"""image_preflight.core.decide.holders: the index of which nodes hold each name answers as asking
every node's list does, through the changes an inventory is carried across (Inventory.updated)."""

import random
from dataclasses import replace

import numpy as np
import pytest

from image_preflight.core.decide import holders
from image_preflight.core.decide.decision import REQUIREMENTS, decide
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.decide.scheduling import NodeTraits
from image_preflight.core.sources.image_hashes import ImageHashes, hashes_of
from image_preflight.image_set import HashSet, ImageSet
from tests.builders.inventories import NOW

POOL = [f"docker.io/library/swe-{i}:openai" for i in range(150)]
ABSENT = [f"docker.io/library/nowhere-{i}:openai" for i in range(5)]
KINDS = ("frozenset", "names", "hashes")
PAUSE = "registry.k8s.io/pause:3.10"


def _refs(kind: str, names: list[str]):
    if kind == "names":
        return ImageSet(names)
    if kind == "hashes":
        return HashSet(ImageHashes(hashes_of(names)))
    return frozenset(names)


def _node(rng: random.Random, name: str) -> NodeImages:
    observed = NOW - rng.uniform(0, 400)
    return NodeImages(name, NodeTraits(name, {"pool": rng.choice(("cpu", "gpu"))}, ()),
                      _refs(rng.choice(KINDS), rng.sample(POOL, rng.randint(0, 90))),
                      complete=rng.random() > 0.1, observed_at=observed, expires_at=observed + 300,
                      source="agent", sandbox_missing=PAUSE if rng.random() < 0.1 else None)


def _change(rng: random.Random, inventory: Inventory, serial: list[int]) -> dict:
    changed: dict = {}
    for _ in range(rng.randint(1, 4)):
        old = rng.choice(inventory.nodes)
        what = rng.random()
        if what < 0.35:  # a renewal: the same names under a new lease
            observed = old.observed_at + rng.uniform(1, 200)
            changed[old.node] = replace(old, observed_at=observed, expires_at=observed + 300)
        elif what < 0.6:  # a new list
            changed[old.node] = replace(_node(rng, old.node), traits=old.traits)
        elif what < 0.75:  # a relabelled node: its names as they were
            changed[old.node] = replace(old, traits=NodeTraits(old.node, {"pool": "cpu"}, ()))
        elif what < 0.88:
            changed[old.node] = None
        else:
            serial[0] += 1
            changed[f"n{serial[0]}"] = _node(rng, f"n{serial[0]}")
    return changed


def _unindexed(inventory: Inventory, monkeypatch: pytest.MonkeyPatch) -> Inventory:
    """The same lists, asked one by one."""
    with monkeypatch.context() as patch:
        patch.setattr(holders, "INDEXED_FROM", 1 << 30)
        bare = Inventory(inventory.nodes, inventory.runtime_classes)
        assert bare.holder_index() is None
    return bare


@pytest.mark.parametrize("seed", range(6))
def test_the_carried_index_answers_as_every_list_does(seed, monkeypatch):
    rng = random.Random(seed)
    serial = [100]
    inventory = Inventory(_node(rng, f"n{i}") for i in range(rng.randint(70, 100)))
    built = carried = 0
    for _ in range(120):
        before = inventory.holder_index()
        inventory = inventory.updated(_change(rng, inventory, serial))
        index = inventory.holder_index()
        if index is not None and before is not None and index.kinds is before.kinds:
            carried += 1
        else:
            built += 1
        nodes = inventory.nodes
        for key in rng.sample(POOL, 8) + ABSENT[:1]:
            assert index.held(nodes, key).tolist() == [key in n.refs for n in nodes], key
        spec = {"containers": [{"name": f"c{i}", "image": image, "imagePullPolicy": "IfNotPresent"}
                               for i, image in enumerate(rng.sample(POOL + ABSENT, rng.randint(1, 3)))],
                "nodeSelector": {"pool": rng.choice(("cpu", "gpu"))}}
        now = NOW + rng.uniform(-100, 400)
        for require in REQUIREMENTS:
            assert decide(spec, inventory, require=require, now=now) == decide(
                spec, _unindexed(inventory, monkeypatch), require=require, now=now)
    assert carried > built > 0  # both paths were taken


def test_a_renewal_carries_the_index_with_nothing_marked():
    rng = random.Random(7)
    inventory = Inventory(replace(_node(rng, f"n{i}"), refs=_refs("hashes", POOL[:i])) for i in range(80))
    index = inventory.holder_index()
    assert index.asked == frozenset()
    old = inventory.get("n5")
    renewed = inventory.updated({"n5": replace(old, observed_at=NOW + 10, expires_at=NOW + 310)})
    assert renewed.holder_index().kinds is index.kinds and renewed.holder_index().asked == frozenset()
    relisted = renewed.updated({"n5": replace(old, refs=_refs("hashes", POOL))})
    assert relisted.holder_index().kinds is index.kinds and relisted.holder_index().asked == {5}
    assert relisted.holder_index().held(relisted.nodes, POOL[100])[5]
    gone = relisted.updated({"n5": None})
    assert gone.holder_index() is not index and gone.holder_index().asked == frozenset()  # places moved: built anew


def test_many_marked_places_rebuild_the_index():
    rng = random.Random(8)
    inventory = Inventory(replace(_node(rng, f"n{i}"), refs=_refs("names", POOL[:50])) for i in range(100))
    index = inventory.holder_index()
    for i in range(holders.MIN_MARKED + 1):
        inventory = inventory.updated({f"n{i}": replace(inventory.get(f"n{i}"), refs=_refs("names", POOL[50:]))})
    rebuilt = inventory.holder_index()
    assert rebuilt.kinds is not index.kinds and rebuilt.asked == frozenset()
    assert rebuilt.held(inventory.nodes, POOL[60]).tolist() == [i <= holders.MIN_MARKED for i in range(100)]


def test_a_node_that_starts_no_pod_lacks_every_image_the_index_finds_it_holding():
    nodes = [NodeImages(f"n{i}", None, _refs("hashes", POOL[:3]), observed_at=NOW, expires_at=NOW + 300,
                        sandbox_missing=PAUSE if i == 3 else None) for i in range(80)]
    spec = {"containers": [{"name": "c", "image": POOL[0], "imagePullPolicy": "IfNotPresent"}]}
    decision = decide(spec, Inventory(nodes), now=NOW)
    assert (decision.outcome, decision.verdicts[0].missing_on) == ("deny", ("n3",))
    assert decide(spec, Inventory(nodes), require="any", now=NOW).outcome == "allow"


def test_small_inventories_and_image_ids_ask_every_list():
    rng = random.Random(9)
    assert Inventory(_node(rng, f"n{i}") for i in range(holders.INDEXED_FROM - 1)).holder_index() is None
    digest = "sha256:" + "ab" * 32
    nodes = [NodeImages(f"n{i}", None, _refs("hashes", POOL[:3]), frozenset({digest}) if i % 2 else frozenset(),
                        observed_at=NOW, expires_at=NOW + 300) for i in range(80)]
    decision = decide({"containers": [{"name": "c", "image": digest, "imagePullPolicy": "IfNotPresent"}]},
                      Inventory(nodes), now=NOW)
    assert decision.outcome == "unknown" and len(decision.verdicts[0].unknown_on) == 40  # lists without IDs


def test_an_empty_list_and_tokens_beyond_the_index():
    index = holders.build([NodeImages(f"n{i}", None, ImageSet()) for i in range(3)])
    assert index.held([NodeImages(f"n{i}", None, ImageSet()) for i in range(3)], "never-seen:1").tolist() == [False] * 3
    assert np.array_equal(ImageSet().tokens(), np.array([], dtype=np.uint32))
