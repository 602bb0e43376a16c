"""RuntimeClass scheduling, as plugin/pkg/admission/runtimeclass/admission.go (setScheduling,
prepareObjects) merges it into a pod at admission."""

import json

import pytest

from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.decision import Outcome, decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.decide.runtime_classes import (
    RuntimeClassConflict,
    RuntimeClassScheduling,
    runtime_class_from_object,
    with_runtime_class,
)
from image_preflight.core.decide.scheduling import PodPlacement, SchedulingSpecError, Taint, Toleration, as_daemon
from image_preflight.core.sources.snapshots import SnapshotError, load_snapshot
from tests.builders.inventories import NOW, SWE, inv, node
from tests.builders.nodes import kube_node

SANDBOX = Taint("sandbox", "gvisor", "NoSchedule")
GVISOR = {
    "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "gvisor"}, "handler": "runsc",
    "scheduling": {"nodeSelector": {"runtime": "gvisor"},
                   "tolerations": [{"key": "sandbox", "operator": "Equal", "value": "gvisor", "effect": "NoSchedule"}]},
}


def _spec(image=SWE, **fields):
    return {"containers": [{"name": "agent", "image": image}], "runtimeClassName": "gvisor", **fields}


def _cluster(sandbox_images=(SWE,), plain_images=("other:1",)):
    """A sandbox node (labelled and tainted for gvisor) and a plain node."""
    sandbox = node("sandbox", *sandbox_images, labels={"runtime": "gvisor"}, taints=[SANDBOX])
    plain = node("plain", *plain_images)
    return inv(sandbox, plain).with_runtime_classes(dict([runtime_class_from_object(GVISOR)]))


def test_the_runtime_class_selector_and_tolerations_send_the_pod_to_its_nodes():
    """Without the merge, the tainted sandbox node would be out and the plain node, lacking the
    image, would deny (a false deny); with it, only the sandbox node is eligible."""
    decision = decide(_spec(), _cluster(), now=NOW)
    assert decision.eligible == ("sandbox",)
    assert decision.outcome == Outcome.ALLOW


def test_the_runtime_class_keeps_the_pod_off_nodes_that_lack_its_label():
    """The other way round: the plain node holds the image, the sandbox node does not (a false
    allow without the merge)."""
    decision = decide(_spec(), _cluster(sandbox_images=("other:1",), plain_images=(SWE,)), now=NOW)
    assert decision.eligible == ("sandbox",)
    assert decision.outcome == Outcome.DENY


def test_a_conflicting_selector_is_forbidden_with_the_plugins_words():
    decision = decide(_spec(nodeSelector={"runtime": "runc"}), _cluster(), now=NOW)
    assert decision.outcome == Outcome.NO_ELIGIBLE_NODE
    assert decision.ineligible == (
        ("pod rejected: conflict: runtimeClass.scheduling.nodeSelector[runtime] = gvisor; "
         "pod.spec.nodeSelector[runtime] = runc", 2),)


def test_an_agreeing_selector_is_no_conflict():
    assert decide(_spec(nodeSelector={"runtime": "gvisor"}), _cluster(), now=NOW).eligible == ("sandbox",)


def test_a_runtime_class_the_inventory_does_not_hold_is_unknown_not_missing():
    decision = decide(_spec(), inv(node("plain", "other:1")), now=NOW)
    assert decision.outcome == Outcome.UNKNOWN
    assert decision.ineligible == (("RuntimeClass 'gvisor' is not in the inventory", 1),)


def test_an_invalid_reference_is_denied_whatever_the_runtime_class():
    assert decide(_spec(image="not a reference:1"), Inventory(), now=NOW).outcome == Outcome.DENY


def test_merging_twice_changes_nothing():
    """A Pod reaches the validating webhook already merged; merging again must be harmless."""
    rc = RuntimeClassScheduling({"runtime": "gvisor"}, (Toleration("sandbox", "Exists"),))
    once = with_runtime_class(PodPlacement(), rc)
    assert with_runtime_class(once, rc) == once


def test_a_daemonset_takes_the_selector_but_not_the_tolerations():
    """NodeShouldRunDaemonPod judges the template alone: the RuntimeClass's tolerations are added
    only to the pods it creates, after the controller chose their nodes."""
    rc = RuntimeClassScheduling({"runtime": "gvisor"}, (Toleration("sandbox", "Exists"),))
    merged = with_runtime_class(as_daemon(PodPlacement()), rc)
    assert dict(merged.node_selector) == {"runtime": "gvisor"} and merged.tolerations == ()


def test_the_merge_raises_the_plugins_conflict():
    with pytest.raises(RuntimeClassConflict, match=r"^conflict: runtimeClass"):
        with_runtime_class(PodPlacement(node_selector={"a": "1"}), RuntimeClassScheduling({"a": "2"}))


@pytest.mark.parametrize("obj, message", [
    ({"metadata": {}}, r"^RuntimeClass: metadata\.name: missing"),
    ({"metadata": {"name": "x"}, "scheduling": []}, r"^RuntimeClass x: scheduling: expected a mapping"),
    ({"metadata": {"name": "x"}, "scheduling": {"nodeSelector": {"a": 1}}},
     r"^RuntimeClass x: scheduling\.nodeSelector\.a: expected a string"),
    ({"metadata": {"name": "x"}, "scheduling": {"tolerations": ["t"]}},
     r"^RuntimeClass x: scheduling\.tolerations\[0\]: expected a mapping"),
])
def test_an_unreadable_runtime_class_names_the_field(obj, message):
    with pytest.raises(SchedulingSpecError, match=message):
        runtime_class_from_object(obj)


def test_a_runtime_class_without_scheduling_changes_nothing():
    name, scheduling = runtime_class_from_object({"metadata": {"name": "runc"}, "handler": "runc"})
    assert name == "runc" and with_runtime_class(PodPlacement(), scheduling) == PodPlacement()


def test_a_snapshot_list_carries_runtime_classes_as_kubectl_get_nodes_runtimeclasses_writes_it():
    items = [kube_node("plain", []), {k: v for k, v in GVISOR.items() if k != "kind"} | {"kind": "RuntimeClass"}]
    inventory = load_snapshot(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}), source="s.json")
    assert set(inventory.runtime_classes) == {"gvisor"} and [n.node for n in inventory.nodes] == ["plain"]
    alone = load_snapshot(json.dumps({"kind": "RuntimeClassList", "items": [{**GVISOR, "kind": None}]}),
                          source="rc.json")
    assert dict(alone.runtime_classes["gvisor"].node_selector) == {"runtime": "gvisor"}


def test_an_unreadable_runtime_class_in_a_snapshot_names_the_item():
    text = json.dumps({"kind": "List", "items": [{"kind": "RuntimeClass", "metadata": {"name": "x"}, "scheduling": 1}]})
    with pytest.raises(SnapshotError, match=r"^s\.json: items\[0\] x: scheduling: expected a mapping"):
        load_snapshot(text, source="s.json")


def test_the_webhook_decides_a_template_with_its_runtime_class():
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"template": {"spec": _spec()}}}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u", "kind": {"group": "batch", "version": "v1", "kind": "Job"},
                          "operation": "CREATE", "namespace": "ns", "object": job}}
    cluster = _cluster(sandbox_images=("other:1",), plain_images=(SWE,))
    assert admit(review, cluster, Settings()).review["response"]["allowed"] is False
    unknown = admit(review, inv(node("plain", SWE)), Settings()).review["response"]
    assert unknown["allowed"] is True
    assert unknown["warnings"] == ["image-preflight: RuntimeClass 'gvisor' is not in the inventory; images not checked"]
