"""How soon `serve`'s decisions follow the cluster, on the real control plane: nodes added, removed,
cordoned and their images changed; etcd compacted so that the resumed watch gets 410 Gone; the
apiserver restarted. Each delay is measured from the API write to the first review decided the
new way, asserted against a generous bound, and written to $IMAGE_PREFLIGHT_FIGURES when set
(benchmarks/control_plane.py collects them into docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
import uuid

import pytest

from tests.builders.stalls import containerd_names
from tests.chart import API_ONLY, apply, merged, secret_values
from tests.controlplane.cluster import create_node, running_control_plane, set_node_images, wait_for
from tests.controlplane.webhook import ServedWebhook

GROUP = {"key": "image-preflight.test/group", "value": "faults", "effect": "NoSchedule"}
LABELS = {"image-preflight.test/group": "faults"}
IMAGE = "swe-smith/task-faults:openai"
OTHER = [containerd_names("swe-smith/task-other:openai", "d")]  # a list without IMAGE (an empty one proves nothing)
BOUND_S = 20.0  # generous: the watch delivers within a second here; CI machines are shared
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory, webhook_certs):
    """A cluster of this module's own: its restarts and compactions leave the controllers of the
    shared one behind (client-go's informers back off, and the node lifecycle controller waits for
    its Lease cache to catch up before it lifts any not-ready taint)."""
    with running_control_plane(tmp_path_factory.mktemp("faults-controlplane")) as plane:
        apply(plane, merged(API_ONLY, secret_values(webhook_certs)))
        yield plane


@pytest.fixture(scope="module")
def served(control_plane, webhook_certs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults")
    kubeconfig = control_plane.service_account_kubeconfig("image-preflight", "image-preflight",
                                                          folder / "sa.kubeconfig")
    create_node(control_plane, "faults-1", images=[containerd_names(IMAGE, "c")], labels=LABELS, taints=[GROUP])
    webhook = ServedWebhook(control_plane, webhook_certs, kubeconfig, folder / "serve.log")
    webhook.start()
    yield webhook
    webhook.stop()
    if path := os.environ.get("IMAGE_PREFLIGHT_FIGURES"):
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(FIGURES) + "\n")


def _review() -> dict:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "faults"},
           "spec": {"nodeSelector": LABELS, "tolerations": [{"key": GROUP["key"], "operator": "Exists"}],
                    "containers": [{"name": "agent", "image": IMAGE, "imagePullPolicy": "IfNotPresent"}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "faults",
        "operation": "CREATE", "object": pod, "userInfo": {"username": "test"}}}


def _allowed(webhook: ServedWebhook) -> bool:
    return webhook.review(_review())["response"]["allowed"]


def _follows(name: str, webhook: ServedWebhook, change, *, allowed: bool) -> float:
    """Make the change, then time until the webhook decides `allowed`."""
    assert _allowed(webhook) != allowed, "the decision must change, or nothing is measured"
    start = time.monotonic()
    change()
    wait_for(lambda: _allowed(webhook) == allowed, f"{name}: decision follows", timeout_s=BOUND_S, interval_s=0.02)
    FIGURES[name] = elapsed = time.monotonic() - start
    return elapsed


def _restarts(webhook: ServedWebhook, reason: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{webhook.metrics_port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(f'image_preflight_watch_restarts_total{{reason="{reason}"}}'):
                return float(line.split()[-1])
    return 0.0


def test_decisions_follow_nodes_added_changed_cordoned_and_removed(control_plane, served):
    core = control_plane.core()
    assert _allowed(served)
    # A new node counts once the node lifecycle controller has lifted its not-ready taint.
    _follows("node added (and made Ready)", served, lambda: create_node(
        control_plane, "faults-2", images=OTHER, labels=LABELS, taints=[GROUP], wait_ready=False), allowed=False)
    _follows("images changed", served,
             lambda: set_node_images(control_plane, "faults-2", [containerd_names(IMAGE, "c")]), allowed=True)
    _follows("image removed", served, lambda: set_node_images(control_plane, "faults-2", OTHER), allowed=False)
    _follows("node cordoned", served, lambda: core.patch_node("faults-2", {"spec": {"unschedulable": True}}),
             allowed=True)
    core.patch_node("faults-2", {"spec": {"unschedulable": False}})
    wait_for(lambda: not _allowed(served), "uncordoned")
    _follows("node removed", served, lambda: core.delete_node("faults-2"), allowed=True)


def test_a_watch_resumed_after_compaction_gets_410_and_relists(control_plane, served):
    core = control_plane.core()
    expired = _restarts(served, "expired")
    # Hold serve still, and cut its connections, so that its watch stays at an old resourceVersion
    # while the cluster moves on; then compact etcd and start an apiserver whose watch cache
    # begins after the changes. The resumed watch can only be told 410 Gone.
    served.popen.send_signal(signal.SIGSTOP)
    try:
        control_plane.restart_apiserver()
        # Ready before the clock starts: the node lifecycle controller, itself reconnecting after
        # the restart, may take longer than BOUND_S to lift the not-ready taint, and what is
        # measured here is serve's relist alone.
        create_node(control_plane, "faults-3", images=OTHER, labels=LABELS, taints=[GROUP])
        for i in range(5):
            core.patch_node("faults-3", {"metadata": {"labels": {"image-preflight.test/touch": str(i)}}})
        control_plane.compact_etcd()
        control_plane.restart_apiserver()
    finally:
        served.popen.send_signal(signal.SIGCONT)
    start = time.monotonic()
    wait_for(lambda: not _allowed(served), "the relist shows faults-3", timeout_s=BOUND_S, interval_s=0.02)
    FIGURES["etcd compacted, apiserver restarted (410, relist)"] = time.monotonic() - start
    assert _restarts(served, "expired") > expired
    core.delete_node("faults-3")
    wait_for(lambda: _allowed(served), "faults-3 removed")


def test_decisions_follow_changes_made_after_an_apiserver_restart(control_plane, served):
    control_plane.restart_apiserver()
    # An image change takes effect at once; a new node would first wait for the node lifecycle
    # controller (itself reconnecting) to lift its not-ready taint.
    _follows("apiserver restarted, then images changed", served,
             lambda: set_node_images(control_plane, "faults-1", OTHER), allowed=False)
    set_node_images(control_plane, "faults-1", [containerd_names(IMAGE, "c")])
    wait_for(lambda: _allowed(served), "faults-1 holds the image again")
