"""LiveInventory fed by NodeWatcher through the real kubernetes client, and `serve --kubeconfig`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest

from tests.fake_apiserver import write_kubeconfig
from tests.test_admission import ABSENT, HELD, NOW, pod_spec, review, workload
from tests.test_webhook_server import EXAMPLE_NODES, missing_job_review, start_webhook, wait_until  # noqa: F401
from webhook.admission import Settings, admit, parse_review
from webhook.inventory import NodeImages
from webhook.live_inventory import LiveInventory
from webhook.node_watch import NodeWatcher


def api_node(name: str, *images: str, pool: str = "cpu", taints: list | None = None, filler: int = 0) -> dict:
    """A Node as the kubelet reports it: one entry per image, largest first, fully qualified names."""
    entries = [{"names": [f"docker.io/library/{image}"], "sizeBytes": 3_000_000_000} for image in images]
    entries += [{"names": [f"docker.io/library/filler-{i}:v1"], "sizeBytes": 1_000_000 - i} for i in range(filler)]
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
    watcher: NodeWatcher
    restarts: list[str]

    def reply(self, spec: dict | None = None, **settings) -> dict:
        rv = review(workload("Job", spec or pod_spec(ABSENT)))
        outcome = admit(parse_review(json.dumps(rv).encode()), self.inventory.current, Settings(**settings), now=NOW)
        return outcome.review["response"]

    def denies_naming(self, *nodes: str) -> Callable[[], bool]:
        def check() -> bool:
            reply = self.reply()
            return not reply["allowed"] and all(n in reply["status"]["message"] for n in nodes)
        return check

    def allows(self) -> bool:
        return self.reply()["allowed"]


@pytest.fixture
def watch_nodes(fake_api_client) -> Iterator[Callable[..., Watched]]:
    started: list[NodeWatcher] = []

    def start(**options) -> Watched:
        inventory, restarts = LiveInventory(**options), []
        watcher = NodeWatcher(fake_api_client, inventory, backoff_initial=0.01, backoff_max=0.1,
                              watch_timeout_seconds=60, on_restart=restarts.append)
        watcher.start()
        started.append(watcher)
        return Watched(inventory, watcher, restarts)

    yield start
    for watcher in started:
        watcher.stop()


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


def test_nodes_added_changed_and_removed_change_the_decision(fake_apiserver, watch_nodes):
    fake_apiserver.put_object("nodes", api_node("cpu-1", ABSENT))
    watched = watch_nodes()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert watched.allows()

    fake_apiserver.put_object("nodes", api_node("cpu-2", HELD))
    wait_until(watched.denies_naming("cpu-2"), "a new node lacking the image denies")
    assert "cpu-1" not in watched.reply()["status"]["message"]

    fake_apiserver.put_object("nodes", api_node("cpu-2", HELD, ABSENT))
    wait_until(watched.allows, "the node reporting the image allows again")

    fake_apiserver.put_object("nodes", api_node("cpu-3"))
    wait_until(watched.denies_naming("cpu-3"), "another node lacking the image denies")
    fake_apiserver.delete_object("nodes", "cpu-3")
    wait_until(watched.allows, "the deleted node no longer counts")


def test_taints_from_the_watch_decide_eligibility(fake_apiserver, watch_nodes):
    gpu_taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    fake_apiserver.put_object("nodes", api_node("cpu-1", ABSENT))
    fake_apiserver.put_object("nodes", api_node("gpu-1", taints=gpu_taint))
    watched = watch_nodes()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert watched.allows()

    fake_apiserver.put_object("nodes", api_node("gpu-1"))  # taint removed: rollouts may land there now
    wait_until(watched.denies_naming("gpu-1"), "the untainted node lacking the image denies")


def test_a_node_reporting_as_many_images_as_the_cap_is_unknown(fake_apiserver, watch_nodes):
    fake_apiserver.put_object("nodes", api_node("cpu-1", HELD, filler=49))  # 50 entries: the list may be cut
    watched = watch_nodes()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert not watched.inventory.current.get("cpu-1").complete

    reply = watched.reply()
    assert reply["allowed"] is True
    assert any(ABSENT in w and "cpu-1" in w and "not confirmed" in w for w in reply["warnings"])
    assert watched.reply(unknown="deny")["allowed"] is False

    fake_apiserver.put_object("nodes", api_node("cpu-1", HELD, filler=48))  # 49: complete
    wait_until(watched.denies_naming("cpu-1"), "a list under the cap proves the image absent")


def test_without_a_cap_a_long_list_is_complete(fake_apiserver, watch_nodes):
    fake_apiserver.put_object("nodes", api_node("cpu-1", HELD, filler=120))
    watched = watch_nodes(max_images=None)
    wait_until(watched.inventory.synced.is_set, "the first list completes")
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
    assert sorted(n.node for n in watched.inventory.current.nodes) == ["cpu-2", "cpu-3"]
    assert "cpu-3" not in watched.reply()["status"]["message"]


def test_a_runtime_list_replaces_node_status_but_not_a_deleted_node(fake_apiserver, watch_nodes):
    fake_apiserver.put_object("nodes", api_node("cpu-1", ABSENT))
    fake_apiserver.put_object("nodes", api_node("cpu-2", HELD, filler=49))
    watched = watch_nodes()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    assert "warnings" in watched.reply()  # cpu-2's list is partial

    runtime = NodeImages.from_names("cpu-2", [HELD, ABSENT], complete=True, observed_at=NOW, source="cri")
    watched.inventory.replace_runtime([runtime])
    cpu2 = watched.inventory.current.get("cpu-2")
    assert cpu2.source == "cri" and cpu2.traits is not None and cpu2.traits.labels["pool"] == "cpu"
    reply = watched.reply()
    assert reply == {"uid": reply["uid"], "allowed": True}

    fake_apiserver.delete_object("nodes", "cpu-2")
    wait_until(lambda: "cpu-2" not in {n.node for n in watched.inventory.current.nodes},
               "the deleted node leaves the inventory although its runtime list remains")


# --- serve --kubeconfig ------------------------------------------------------------------------------


def restarts_counted(webhook) -> bool:
    return 'image_preflight_watch_restarts_total{reason="error"}' in webhook.metrics()


def test_serve_with_a_kubeconfig_denies_once_the_node_appears(fake_apiserver, start_webhook, tmp_path):  # noqa: F811 - fixture
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


def test_serve_with_a_kubeconfig_is_unready_while_the_watch_is_silent(
    fake_apiserver, start_webhook, tmp_path  # noqa: F811 - fixture
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


def test_a_review_of_a_workload_without_images_to_check_is_allowed(fake_apiserver, watch_nodes):
    watched = watch_nodes()
    wait_until(watched.inventory.synced.is_set, "the first list completes")
    reply = watched.reply(pod_spec(HELD, policy="Always"))
    assert reply["allowed"] is True
    assert reply["warnings"] == [f"image-preflight: {HELD} not checked (imagePullPolicy Always pulls it)"]
