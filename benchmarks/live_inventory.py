"""What a change on one node costs `serve`'s inventory (webhook/live_inventory.py), at fleet sizes.

    python benchmarks/live_inventory.py [--nodes 1000,5000] [--repeat 50]

In one process, for each size: nodes with a status list and an agent's leased list each.
1. Publishing one node's change (a label: Node status that a decision reads) against publishing
   the whole inventory afresh, as a relist does and as every change did before (the baseline).
2. The first decision after a renewal of a tenth of the nodes' Leases: on an image decided
   before it (remembered through it), on a new image (the placement remembered), against the
   same on an inventory with nothing remembered (the baseline).
3. With the fleet's lists instead (LISTED images each, hashed, as `--list-form hashes` publishes
   them): a decision on an image every node holds, remembered and new (the placement
   remembered), against a new one that asks every node's list as before the index of holders
   (core/decide/holders.py; the baseline); and a new image no node holds, whose cost is a look at
   every node that lacks it. Then what building that index takes. Then the first decision after
   a Node's labels changed (as when a taint is added or lifted), whose placement is found again at
   that node alone, against the same with every node's filters run (the baseline).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from image_preflight.core.decide import holders
from image_preflight.core.decide.decision import decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.sources.runtime_lists import AGENT_NAMESPACE, image_hashes, lease_object, runtime_object
from image_preflight.webhook.live_inventory import RENEWALS_WITHIN_S, LiveInventory

IMAGES = 50  # per node: what a change costs does not depend on a list's length
LISTED = 5000  # per node in part 3: a hashed list's lookup deepens with its length
LEASE_S = 300


def node(name: str, label: str = "a") -> dict:
    images = [{"names": [f"docker.io/library/swe-{i}:openai"], "sizeBytes": 1} for i in range(IMAGES)]
    return {"metadata": {"name": name, "labels": {"pool": "cpu", "mark": label}}, "spec": {},
            "status": {"images": images}}


def listed(name: str, now: float) -> dict:
    images = [{"id": f"sha256:{i:064x}", "repoTags": [f"docker.io/library/swe-{i}:openai"]} for i in range(IMAGES)]
    return runtime_object(name, images, observed_at=now, lease_seconds=LEASE_S)


def pod(image: str) -> dict:
    return {"containers": [{"name": "rollout", "image": image, "imagePullPolicy": "IfNotPresent"}],
            "nodeSelector": {"pool": "cpu"}}


def ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def at_size(nodes: int, repeat: int) -> dict:
    now = time.time()
    names = [f"node-{n}" for n in range(nodes)]
    live = LiveInventory(max_images=-1)
    live.replace_nodes(node(name) for name in names)
    live.replace_runtime_objects(listed(name, now) for name in names)
    live.replace_renewals(())

    full, one = [], []
    for index in range(repeat):
        start = time.perf_counter()
        live.replace_runtime_classes(())  # publishes every node afresh
        full.append(time.perf_counter() - start)
        start = time.perf_counter()
        live.upsert_node(node(names[index], label=str(index)))
        one.append(time.perf_counter() - start)

    remembered, placed, fresh = [], [], []
    for index in range(repeat):
        decide(pod("docker.io/library/swe-1:openai"), live.current, now=time.time())
        before = live.current
        for name in names[index::10]:
            live.upsert_renewal(lease_object(name, AGENT_NAMESPACE, renewed_at=time.time(), lease_seconds=LEASE_S))
        while live.current is before:
            time.sleep(RENEWALS_WITHIN_S / 10)
        for image, samples in (("docker.io/library/swe-1:openai", remembered), (f"new-{index}:openai", placed)):
            start = time.perf_counter()
            decide(pod(image), live.current, now=time.time())
            samples.append(time.perf_counter() - start)
        bare = Inventory(live.current.nodes, live.current.runtime_classes)
        bare.holder_index()  # built as serve builds it, on publishing
        start = time.perf_counter()
        decide(pod(f"fresh-{index}:openai"), bare, now=time.time())
        fresh.append(time.perf_counter() - start)
    fleet_images = [{"id": f"sha256:{i:064x}", "repoTags": [f"docker.io/library/swe-{i}:openai"]}
                    for i in range(LISTED)]
    hashes = image_hashes(fleet_images)
    fleet = LiveInventory(max_images=-1)
    fleet.replace_nodes(node(name) for name in names)
    fleet.replace_runtime_objects(runtime_object(name, fleet_images, observed_at=now, lease_seconds=LEASE_S,
                                                 hashes=hashes)
                                  for name in names)
    fleet.replace_renewals(())
    indexed = fleet.current
    asking = Inventory(indexed.nodes, indexed.runtime_classes)
    decide(pod("docker.io/library/swe-0:openai"), indexed, now=time.time())  # the placement
    known, new, asked, nowhere, build = [], [], [], [], []
    for index in range(repeat):
        for image, samples in (("docker.io/library/swe-0:openai", known),
                               (f"docker.io/library/swe-{index + 1}:openai", new),
                               (f"docker.io/library/nowhere-{index}:openai", nowhere)):
            start = time.perf_counter()
            decide(pod(image), indexed, now=time.time())
            samples.append(time.perf_counter() - start)
    indexed_from, holders.INDEXED_FROM = holders.INDEXED_FROM, 1 << 30  # `asking` builds none
    decide(pod("docker.io/library/swe-0:openai"), asking, now=time.time())
    for index in range(repeat):
        start = time.perf_counter()
        decide(pod(f"docker.io/library/swe-{index + 1}:openai"), asking, now=time.time())
        asked.append(time.perf_counter() - start)
    holders.INDEXED_FROM = indexed_from
    # A Node's labels changed (as a taint added or lifted): the placement is found again at that
    # node alone, against every node's filters on an inventory with nothing remembered.
    relabelled, afresh = [], []
    for index in range(repeat):
        fleet.upsert_node(node(names[index], label=f"changed-{index}"))
        start = time.perf_counter()
        decide(pod("docker.io/library/swe-0:openai"), fleet.current, now=time.time())
        relabelled.append(time.perf_counter() - start)
        bare = Inventory(fleet.current.nodes, fleet.current.runtime_classes)
        bare.holder_index()
        start = time.perf_counter()
        decide(pod("docker.io/library/swe-0:openai"), bare, now=time.time())
        afresh.append(time.perf_counter() - start)
    for _ in range(max(3, repeat // 10)):
        start = time.perf_counter()
        holders.build(indexed.nodes)
        build.append(time.perf_counter() - start)
    return {"nodes": nodes,
            "publish_all_ms": ms(full), "publish_one_node_ms": ms(one), "one_to_all": ms(one) / ms(full),
            "decision_nothing_remembered_ms": ms(fresh),
            "decision_after_renewal_remembered_ms": ms(remembered),
            "decision_after_renewal_new_image_ms": ms(placed),
            "new_image_to_nothing_remembered": ms(placed) / ms(fresh),
            "hashed_lists_decision_remembered_ms": ms(known), "hashed_lists_decision_new_image_ms": ms(new),
            "hashed_lists_decision_new_image_asking_every_list_ms": ms(asked), "new_to_asking": ms(new) / ms(asked),
            "hashed_lists_decision_image_no_node_holds_ms": ms(nowhere), "hashed_lists_index_build_ms": ms(build),
            "decision_after_a_node_relabelled_ms": ms(relabelled), "decision_placement_afresh_ms": ms(afresh),
            "relabelled_to_afresh": ms(relabelled) / ms(afresh)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,5000", help="sizes, comma-separated (default 1000,5000)")
    parser.add_argument("--repeat", type=int, default=50, help="samples of each figure (default 50)")
    args = parser.parse_args()
    for nodes in map(int, args.nodes.split(",")):
        print(json.dumps({key: round(value, 4) if isinstance(value, float) else value
                          for key, value in at_size(nodes, args.repeat).items()}), flush=True)


if __name__ == "__main__":
    main()
