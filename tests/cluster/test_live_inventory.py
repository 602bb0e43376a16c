"""LiveInventory fed by the node watch through the real kubernetes client: on the real control plane,
and on the in-process double where a list is held failing, a watch dropped or its history compacted
at a chosen moment; and `serve --kubeconfig` while its lists fail."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest

from image_preflight.core.admission.body import parse_review
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.inventory import NodeImages
from image_preflight.kube.nodes import node_watcher
from image_preflight.kube.watch import ResourceWatcher
from image_preflight.webhook.live_inventory import LiveInventory
from tests.builders.inventories import NOW
from tests.builders.reviews import ABSENT, EXAMPLE_NODES, HELD, missing_job_review, pod_spec, review, workload
from tests.controlplane.cluster import PARKED, set_node_images
from tests.fake_apiserver import write_kubeconfig
from tests.serving import wait_until

# The reviewed workloads may land on this test's nodes, which carry the PARKED taint.
TOLERATIONS = [{"key": PARKED["key"], "operator": "Exists"}]
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def image_names(*images: str, filler: int = 0) -> list[list[str]]:
    """A Node's status.images as the kubelet reports it: fully qualified names, one entry per image."""
    return [[f"docker.io/library/{image}"] for image in images] + [
        [f"docker.io/library/filler-{i}:v1"] for i in range(filler)]


def api_node(name: str, *images: str, pool: str = "cpu", taints: list | None = None, filler: int = 0) -> dict:
    """A Node as the kubelet reports it: one entry per image, largest first, fully qualified names."""
    entries = [{"names": names, "sizeBytes": 3_000_000_000 - i}
               for i, names in enumerate(image_names(*images, filler=filler))]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": pool}},
        "spec": {"taints": taints} if taints else {},
        "status": {"images": entries, "conditions": [{"type": "Ready", "status": "True"}]},
    }


@dataclass
class Watched:
    inventory: LiveInventory
    watcher: ResourceWatcher
    restarts: list[str]

    def reply(self, spec: dict | None = None, **settings) -> dict:
        rv = review(workload("Job", spec or pod_spec(ABSENT, tolerations=TOLERATIONS)))
        outcome = admit(parse_review(json.dumps(rv).encode()), self.inventory.current, Settings(**settings), now=NOW)
        return outcome.review["response"]

    def denies_naming(self, *nodes: str) -> Callable[[], bool]:
        def check() -> bool:
            reply = self.reply()
            return not reply["allowed"] and all(n in reply["status"]["message"] for n in nodes)
        return check

    def allows(self) -> bool:
        return self.reply()["allowed"]

    def nodes(self) -> list[str]:
        return sorted(n.node for n in self.inventory.current.nodes)


class Watchers:
    def __init__(self) -> None:
        self.started: list[ResourceWatcher] = []

    def start(self, api_client, label_selector: str | None = None, **options) -> Watched:
        inventory, restarts = LiveInventory(**options), []
        watcher = node_watcher(api_client, inventory, label_selector=label_selector, backoff_initial=0.01,
                              backoff_max=0.1, watch_timeout_seconds=60, on_restart=restarts.append)
        watcher.start()
        self.started.append(watcher)
        return Watched(inventory, watcher, restarts)

    def stop(self) -> None:
        for watcher in self.started:
            watcher.stop()


# --- on the real control plane -------------------------------------------------------------------


@pytest.fixture
def watch_cluster(control_plane, case) -> Iterator[Callable[..., Watched]]:
    """Start a LiveInventory following this test's nodes."""
    api_client = control_plane.api_client()
    watchers = Watchers()
    yield lambda **options: watchers.start(api_client, case.selector, **options)
    watchers.stop()
    api_client.close()


def cpu_node(case, base: str, *images: str, filler: int = 0, **options) -> str:
    """A node of this test in pool cpu, not waiting for it to become ready; returns its name."""
    return case.node(base, images=image_names(*images, filler=filler), labels={"pool": "cpu"}, wait_ready=False,
                     **options)["metadata"]["name"]


def test_nodes_added_changed_and_removed_change_the_decision(control_plane, case, watch_cluster):
    cpu1 = cpu_node(case, "cpu-1", ABSENT)
    case.wait_ready()
    watched = watch_cluster()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert watched.nodes() == [cpu1] and watched.allows()

    cpu2 = cpu_node(case, "cpu-2", HELD)
    wait_until(watched.denies_naming(cpu2), "a new node lacking the image denies")
    assert cpu1 not in watched.reply()["status"]["message"]

    set_node_images(control_plane, cpu2, image_names(HELD, ABSENT))
    wait_until(watched.allows, "the node reporting the image allows again")

    cpu3 = cpu_node(case, "cpu-3", filler=1)  # an empty list would prove nothing
    wait_until(watched.denies_naming(cpu3), "another node lacking the image denies")
    control_plane.core().delete_node(cpu3)
    wait_until(watched.allows, "the deleted node no longer counts")
    assert watched.nodes() == [cpu1, cpu2]


def test_taints_from_the_watch_decide_eligibility(control_plane, case, watch_cluster):
    cpu_node(case, "cpu-1", ABSENT)
    gpu1 = cpu_node(case, "gpu-1", filler=1, taints=[PARKED, GPU_TAINT])
    case.wait_ready()
    watched = watch_cluster()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert len(watched.nodes()) == 2 and watched.allows()

    # The GPU taint removed: rollouts may land there now.
    control_plane.core().patch_node(gpu1, {"spec": {"taints": [PARKED]}})
    wait_until(watched.denies_naming(gpu1), "the untainted node lacking the image denies")


def test_a_node_reporting_as_many_images_as_the_cap_is_unknown(control_plane, case, watch_cluster):
    cpu1 = cpu_node(case, "cpu-1", HELD, filler=49)  # 50 entries: the list may be cut
    case.wait_ready()
    watched = watch_cluster()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert not watched.inventory.current.get(cpu1).complete

    reply = watched.reply()
    assert reply["allowed"] is True
    assert any(ABSENT in w and cpu1 in w and "not confirmed" in w for w in reply["warnings"])
    assert watched.reply(unknown="deny")["allowed"] is False

    set_node_images(control_plane, cpu1, image_names(HELD, filler=48))  # 49: complete
    wait_until(watched.denies_naming(cpu1), "a list under the cap proves the image absent")


def test_without_a_cap_a_long_list_is_complete(case, watch_cluster):
    cpu1 = cpu_node(case, "cpu-1", HELD, filler=120)
    case.wait_ready()
    watched = watch_cluster(max_images=None)
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert watched.inventory.current.get(cpu1).complete
    assert watched.denies_naming(cpu1)()


def test_a_list_longer_than_the_cap_is_logged_once_as_a_wrong_setting(caplog):
    live = LiveInventory(max_images=50)
    node = api_node("cpu-long", HELD, filler=60)
    with caplog.at_level("WARNING"):
        live.replace_nodes([node])
        live.upsert_node(node)
    assert not live.current.get("cpu-long").complete
    warnings = [r.getMessage() for r in caplog.records if "cpu-long" in r.getMessage()]
    assert len(warnings) == 1 and "more images than --max-images 50" in warnings[0]


def test_a_runtime_list_replaces_node_status_but_not_a_deleted_node(control_plane, case, watch_cluster):
    cpu_node(case, "cpu-1", ABSENT)
    cpu2 = cpu_node(case, "cpu-2", HELD, filler=49)
    case.wait_ready()
    watched = watch_cluster()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert "warnings" in watched.reply()  # cpu-2's list is partial

    runtime = NodeImages.from_names(cpu2, [HELD, ABSENT], complete=True, observed_at=NOW, source="cri")
    watched.inventory.replace_runtime([runtime])
    current = watched.inventory.current.get(cpu2)
    assert current.source == "cri" and current.traits is not None and current.traits.labels["pool"] == "cpu"
    reply = watched.reply()
    assert reply == {"uid": reply["uid"], "allowed": True}

    control_plane.core().delete_node(cpu2)
    wait_until(lambda: cpu2 not in watched.nodes(),
               "the deleted node leaves the inventory although its runtime list remains")


def test_runtime_classes_from_the_watch_follow_creates_updates_and_deletes(control_plane, case):
    from kubernetes import client as k8s

    from image_preflight.kube.runtime_classes import runtime_class_watcher

    api_client = control_plane.api_client()
    node_v1 = k8s.NodeV1Api(control_plane.core().api_client)
    name = case.name("gvisor")
    live = LiveInventory()
    watcher = runtime_class_watcher(api_client, live, backoff_initial=0.01, backoff_max=0.1)
    watcher.start()
    try:
        def selector():
            return (c := live.current.runtime_classes.get(name)) and dict(c.node_selector)

        node_v1.create_runtime_class({"metadata": {"name": name, "labels": case.labels}, "handler": "runsc",
                                      "scheduling": {"nodeSelector": {"runtime": "gvisor"}}})
        wait_until(lambda: selector() == {"runtime": "gvisor"}, "the created RuntimeClass is seen")
        node_v1.patch_runtime_class(name, {"scheduling": {"nodeSelector": {"runtime": "kata"}}})
        wait_until(lambda: selector() == {"runtime": "kata"}, "the changed selector is seen")
        node_v1.delete_runtime_class(name)
        wait_until(lambda: name not in live.current.runtime_classes, "the deleted RuntimeClass is gone")
    finally:
        watcher.stop()
        api_client.close()


def test_an_unreadable_runtime_class_update_stops_deciding_with_the_old_one():
    live = LiveInventory()
    live.replace_runtime_classes([{"metadata": {"name": "gvisor"}, "scheduling": {"nodeSelector": {"a": "b"}}}])
    assert set(live.current.runtime_classes) == {"gvisor"}
    live.upsert_runtime_class({"metadata": {"name": "gvisor"}, "scheduling": {"nodeSelector": []}})
    assert live.current.runtime_classes == {}


def test_a_review_of_a_workload_without_images_to_check_is_allowed(watch_cluster):
    watched = watch_cluster()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    reply = watched.reply(pod_spec(HELD, policy="Always"))
    assert reply["allowed"] is True
    assert reply["warnings"] == [f"image-preflight: {HELD} not checked (imagePullPolicy Always pulls it)"]


# --- on the double: a list held failing, a watch dropped, its history compacted ------------------------


@pytest.fixture
def watch_nodes(fake_api_client) -> Iterator[Callable[..., Watched]]:
    watchers = Watchers()
    yield lambda **options: watchers.start(fake_api_client, **options)
    watchers.stop()


def test_nothing_is_decided_against_before_the_first_list(fake_apiserver, watch_nodes):
    fake_apiserver.put_object("nodes", api_node("cpu-1", HELD))
    fake_apiserver.fail_next(10**9, status=503)
    watched = watch_nodes()
    wait_until(lambda: "error" in watched.restarts, "the first list fails")

    assert not watched.inventory.synced.is_set()
    reply = watched.reply()
    assert reply["allowed"] is True
    assert any("no node" in w for w in reply["warnings"])

    fake_apiserver.fail_next(0)
    wait_until(watched.inventory.synced.is_set, "the first list succeeds")
    assert watched.denies_naming("cpu-1")()


def test_after_410_a_relist_converges_the_decisions(fake_apiserver, watch_nodes):
    fake_apiserver.put_object("nodes", api_node("cpu-1", ABSENT))
    fake_apiserver.put_object("nodes", api_node("cpu-2", ABSENT))
    watched = watch_nodes()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert watched.allows()

    # Keep the watcher away while nodes change, then forget the history it would replay.
    fake_apiserver.fail_next(10**9, status=503)
    fake_apiserver.drop_watches()
    fake_apiserver.delete_object("nodes", "cpu-1")
    fake_apiserver.put_object("nodes", api_node("cpu-2", HELD))
    fake_apiserver.put_object("nodes", api_node("cpu-3", ABSENT))
    fake_apiserver.compact()
    fake_apiserver.fail_next(0)

    wait_until(watched.denies_naming("cpu-2"), "the relisted view denies for the changed node")
    assert "expired" in watched.restarts
    assert watched.nodes() == ["cpu-2", "cpu-3"]
    assert "cpu-3" not in watched.reply()["status"]["message"]


# --- serve --kubeconfig ------------------------------------------------------------------------------


def restarts_counted(webhook) -> bool:
    return 'image_preflight_watch_restarts_total{reason="error"}' in webhook.metrics()


def test_serve_with_a_kubeconfig_denies_once_the_node_appears(fake_apiserver, start_webhook, tmp_path):
    kubeconfig = write_kubeconfig(fake_apiserver, tmp_path / "kubeconfig")
    fake_apiserver.fail_next(10**9, status=503)
    webhook = start_webhook("--kubeconfig", str(kubeconfig))

    wait_until(lambda: restarts_counted(webhook), "the failed first list is counted")
    assert webhook.get("/readyz")[0] == 503
    assert webhook.get("/healthz") == (200, {"status": "ok"})

    fake_apiserver.fail_next(0)
    wait_until(lambda: webhook.get("/readyz")[0] == 200, "ready after the first full list")
    status, reply = webhook.post(missing_job_review())
    assert status == 200 and reply["response"]["allowed"] is True
    assert any("no node" in w for w in reply["response"]["warnings"])

    example = json.loads(EXAMPLE_NODES.read_text())["items"]
    for item in example:
        fake_apiserver.put_object("nodes", item)

    def denied() -> bool:
        response = webhook.post(missing_job_review())[1]["response"]
        return not response["allowed"] and "cpu-node-1" in response["status"]["message"]

    wait_until(denied, "the Job is denied once the node is watched")
    text = webhook.metrics()
    assert "image_preflight_inventory_nodes 2.0" in text
    assert "image_preflight_inventory_truncated_nodes 0.0" in text
    # Each node came as a change of its own, after the first lists.
    node_changes = re.search(r'^image_preflight_inventory_publications_total\{by="node"\} (\S+)$', text, re.M)
    assert node_changes and float(node_changes.group(1)) >= 2, text


def test_serve_with_a_kubeconfig_is_unready_while_the_watch_is_silent(
    fake_apiserver, start_webhook, tmp_path
):
    fake_apiserver.put_object("nodes", api_node("cpu-1", HELD))
    kubeconfig = write_kubeconfig(fake_apiserver, tmp_path / "kubeconfig")
    webhook = start_webhook("--kubeconfig", str(kubeconfig), "--max-inventory-age", "2")
    wait_until(lambda: webhook.get("/readyz")[0] == 200, "ready after the first full list")

    fake_apiserver.fail_next(10**9, status=503)
    fake_apiserver.drop_watches()
    wait_until(lambda: webhook.get("/readyz")[0] == 503, "unready once the view is older than allowed")
    assert restarts_counted(webhook)

    fake_apiserver.fail_next(0)
    wait_until(lambda: webhook.get("/readyz")[0] == 200, "ready again once the watch resumes")
