"""Hostile inventories where `serve` reads them: the file poller keeps the previous inventory for each
hostile file and takes the next good one, the live conversions drop an object they cannot read
instead of raising, and `serve --inventory` goes on answering through them."""

from __future__ import annotations

import copy
import json
import logging
import random

from image_preflight.webhook import live_inventory
from image_preflight.webhook.live_inventory import FileInventory, LiveInventory
from tests.builders.inventories import NOW
from tests.builders.nodes import cri_image, kube_node, runtime, sha, status_image
from tests.builders.reviews import ABSENT, EXAMPLE_NODES, missing_job_review
from tests.hostile_inventories import ALPHA, BETA, GVISOR, HOSTILE, SEED_NODE, holding, mutate, outcome, set_in, write
from tests.serving import wait_until

# --- the file poller goes on after every hostile file ----------------------------------------------


def test_reload_keeps_the_previous_inventory_for_each_hostile_file_then_takes_the_next_good_one(tmp_path, caplog):
    path = write(tmp_path / "nodes.json", holding(ALPHA))
    source = FileInventory(path, interval=3600)  # polled by hand here
    assert (outcome(source.current, ALPHA), outcome(source.current, BETA)) == ("allow", "deny")
    for _, _, content, _ in HOSTILE:
        write(path, content)
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            assert source.reload_if_changed() is False
            assert source.reload_if_changed() is False  # read again, said once
        [record] = [r for r in caplog.records if "keeping the previous inventory" in r.getMessage()]
        assert record.getMessage().isprintable()
        assert outcome(source.current, ALPHA) == "allow"
    write(path, holding(BETA))
    assert source.reload_if_changed() is True
    assert (outcome(source.current, ALPHA), outcome(source.current, BETA)) == ("deny", "allow")


def test_the_polling_thread_outlives_hostile_files_and_failing_polls(tmp_path, caplog, monkeypatch):
    path = write(tmp_path / "nodes.json", holding(ALPHA))
    source = FileInventory(path, interval=0.01)
    thread = source.start()
    try:
        with caplog.at_level(logging.WARNING):
            for case_id, _, content, _ in HOSTILE:
                caplog.clear()
                write(path, content)
                wait_until(lambda: any("keeping the previous inventory" in r.getMessage() for r in caplog.records),
                           f"the {case_id} file is refused")
            # A failure no reader foresaw: logged on one line, and the next poll runs all the same.
            real = live_inventory.load_inventory_file
            failures = iter([RecursionError("maximum recursion depth exceeded"), MemoryError()])

            def failing(*args, **kwargs):
                failure = next(failures, None)
                if failure is not None:
                    raise failure
                return real(*args, **kwargs)

            monkeypatch.setattr(live_inventory, "load_inventory_file", failing)
            caplog.clear()
            write(path, holding(BETA))
            wait_until(lambda: outcome(source.current, BETA) == "allow", "the good file after them is read")
        assert [r.getMessage() for r in caplog.records if "poll failed" in r.getMessage()] == [
            "inventory-file: poll failed, trying again in 0.01s: RecursionError: maximum recursion depth exceeded",
            "inventory-file: poll failed, trying again in 0.01s: MemoryError",
        ]
        assert outcome(source.current, ALPHA) == "deny" and thread.is_alive()
    finally:
        source.stop()
        thread.join(timeout=5)


# --- the live conversions drop what they cannot read ----------------------------------------------


def api_node(name: str, *images: str) -> dict:
    return kube_node(name, [status_image(*image.rsplit(":", 1)) for image in images])


def hostile_nodes() -> list:
    good = api_node("cpu-1", ALPHA)
    cases = [None, "cpu-1", ["cpu-1"], 5, {}, {"metadata": {"name": 10**5000}}]
    for path, value in [("metadata.name", ["cpu-1"]), ("metadata.name", 5), ("metadata.name", "cpu-\ud800"),
                        ("status.images", "alpha:v1"), ("status.images.0.names", [1]), ("status.images.0", "x"),
                        ("metadata.labels", ["a"]), ("metadata.labels.pool", float("nan")), ("spec.taints", "gpu"),
                        ("spec.taints", [{"key": {"a": 1}}]), ("spec.unschedulable", "yes"), ("status", ["Ready"])]:
        node = copy.deepcopy(good)
        node["metadata"].setdefault("labels", {})["pool"] = "cpu"
        set_in(path, value)(node)
        cases.append(node)
    return cases


def hostile_runtime_objects() -> list:
    cases = [None, [], "cpu-1", {"spec": []}]
    for path, value in [("spec.images.0.id", ["x"]), ("spec.images.0.id", {"a": 1}), ("spec.images.0.repoTags", [5]),
                        ("spec.images.0.repoTags", "alpha:v1"), ("spec.nodeName", ["cpu-1"]),
                        ("spec.leaseDurationSeconds", 10**5000), ("spec.leaseDurationSeconds", float("inf")),
                        ("spec.observedAt", 5), ("spec.images", {}), ("spec.images.0", "alpha:v1")]:
        obj = runtime("cpu-1", images=[cri_image(sha("a"), [ALPHA])], observed_at=NOW)
        set_in(path, value)(obj)
        cases.append(obj)
    return cases


def hostile_classes() -> list:
    cases = [None, [], "gvisor", {"metadata": {"name": ["gvisor"]}}, {"metadata": {"name": {"a": 1}}}]
    for path, value in [("metadata.name", 5), ("scheduling", []), ("scheduling.nodeSelector", ["a"]),
                        ("scheduling.nodeSelector.sandbox", 1), ("scheduling.tolerations", "x"),
                        ("scheduling.tolerations.0", "x"), ("scheduling.tolerations.0.key", [])]:
        obj = copy.deepcopy(GVISOR)
        set_in(path, value)(obj)
        cases.append(obj)
    return cases


def test_live_conversions_return_none_for_every_hostile_object(caplog):
    live = LiveInventory()
    with caplog.at_level(logging.WARNING):
        for obj in hostile_nodes():
            assert live._convert(obj) is None
        for obj in hostile_runtime_objects():
            assert live._convert_runtime(obj) is None
        for obj in hostile_classes():
            assert live._convert_class(obj) is None
    ignoring = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignoring")]
    assert len(ignoring) == len(hostile_nodes()) + len(hostile_runtime_objects()) + len(hostile_classes())


def test_the_live_inventory_drops_hostile_objects_and_takes_the_next_good_ones():
    live = LiveInventory()
    live.replace_nodes([api_node("cpu-1", ALPHA)])
    live.replace_runtime_objects([runtime("cpu-1", images=[cri_image(sha("a"), [ALPHA])], observed_at=NOW)])
    live.replace_runtime_classes([GVISOR])
    assert (outcome(live.current, ALPHA), outcome(live.current, BETA)) == ("allow", "deny")

    for obj in hostile_nodes():
        live.upsert_node(obj)
        live.replace_nodes([api_node("cpu-1", ALPHA), obj])
    for obj in hostile_runtime_objects():
        live.replace_runtime_objects([obj])
        live.upsert_runtime(obj)
        live.delete_runtime("")
    for obj in hostile_classes():
        live.replace_runtime_classes([GVISOR, obj])
        live.upsert_runtime_class(obj)
        live.delete_runtime_class(obj)
    assert [n.node for n in live.current.nodes] == ["cpu-1"]
    assert outcome(live.current, ALPHA) == "allow"

    live.upsert_node(api_node("cpu-1", BETA))
    live.upsert_runtime(runtime("cpu-1", images=[cri_image(sha("b"), [BETA])], observed_at=NOW))
    live.upsert_runtime_class(GVISOR)
    assert (outcome(live.current, ALPHA), outcome(live.current, BETA)) == ("deny", "allow")
    assert "gvisor" in live.current.runtime_classes


def test_fuzzed_objects_never_raise_from_the_live_inventory():
    rng = random.Random(20261201)
    deep: list = []
    tip = deep
    for _ in range(50_000):  # deeper than any recursion could follow
        tip.append([])
        tip = tip[0]
    python_values = {"<<huge>>": 10**5000, "<<-huge>>": -(10**5000), "<<nan>>": float("nan"),
                     "<<inf>>": float("inf"), "<<-inf>>": float("-inf"), "<<deep>>": deep, "<<shallow>>": [[[]]]}

    def real(value):
        if isinstance(value, str):
            return python_values.get(value, value)
        if isinstance(value, dict):
            return {key: real(item) for key, item in value.items()}
        if isinstance(value, list):
            return [real(item) for item in value]
        return value

    live = LiveInventory()
    logging.getLogger(live_inventory.__name__).disabled = True
    try:
        for _ in range(1500):
            form = rng.choice(["node", "runtime", "class"])
            obj = real(mutate({"node": SEED_NODE, "runtime": runtime("worker-1"), "class": GVISOR}[form], rng))
            if form == "node":
                live.upsert_node(obj)
                live.replace_nodes([obj, SEED_NODE])
            elif form == "runtime":
                live.upsert_runtime(obj)
                live.replace_runtime_objects([obj])
            else:
                live.upsert_runtime_class(obj)
                live.replace_runtime_classes([obj])
    finally:
        logging.getLogger(live_inventory.__name__).disabled = False
    assert live.current.get("worker-1") is not None


# --- end to end: serve --inventory goes on after a hostile file -------------------------------------


def test_serve_keeps_answering_through_hostile_files_and_reads_the_next_good_one(start_webhook, tmp_path, caplog):
    snapshot = write(tmp_path / "nodes.json", EXAMPLE_NODES.read_text())
    webhook = start_webhook("--inventory", str(snapshot))
    assert webhook.post(missing_job_review())[1]["response"]["allowed"] is False

    for case_id in ("huge-integer", "nesting-too-deep", "node-images-id-a-list", "crictl-id-a-list", "nan"):
        content = next(case[2] for case in HOSTILE if case[0] == case_id)
        caplog.clear()
        write(snapshot, content)
        wait_until(lambda: any("keeping the previous inventory" in r.getMessage() for r in caplog.records),
                   f"the {case_id} file is refused")
        status, reply = webhook.post(missing_job_review())
        assert status == 200 and reply["response"]["allowed"] is False  # the example nodes still decide
        assert webhook.get("/readyz")[0] == 200

    nodes = json.loads(EXAMPLE_NODES.read_text())
    cpu = next(n for n in nodes["items"] if n["metadata"]["name"] == "cpu-node-1")
    cpu["status"]["images"].append({"names": [f"docker.io/library/{ABSENT}"], "sizeBytes": 1_000_000_000})
    write(snapshot, json.dumps(nodes))
    wait_until(lambda: webhook.post(missing_job_review())[1]["response"]["allowed"], "the good file is read")
