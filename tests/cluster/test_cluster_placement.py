"""Where the real controllers and scheduler put pods, against where the decision said they may land:
DaemonSets, spec.nodeName, RuntimeClasses, Jobs resumed from suspend and Pods released from their
scheduling gates, each decided by the deployed webhook on the real control plane."""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.core.decide.decision import Outcome, decide
from image_preflight.core.decide.runtime_classes import runtime_class_from_object
from image_preflight.core.decide.workloads import pod_spec_of
from image_preflight.core.sources.snapshots import load_snapshot
from tests.builders.stalls import DENIED_PREFIX, ENFORCE_LABEL, containerd_names
from tests.controlplane.cluster import create_node, new_namespace, wait_for
from tests.controlplane.webhook import ServedWebhook

ID = uuid.uuid4().hex[:6]
POOL = {"image-preflight.test/pool": ID}
HELD = f"swe-smith/held-{ID}:openai"  # on a, b (cordoned) and d
ONLY_A = f"swe-smith/only-a-{ID}:openai"
SANDBOXED = f"swe-smith/sandboxed-{ID}:openai"  # only on the sandbox node
FILLER = f"swe-smith/filler-{ID}:v1"  # so that every list is a list (an empty one proves nothing)
SANDBOX_TAINT = {"key": "image-preflight.test/sandbox", "value": ID, "effect": "NoSchedule"}
DEDICATED_TAINT = {"key": "image-preflight.test/dedicated", "value": ID, "effect": "NoSchedule"}
RUNTIME_CLASS = f"sandbox-{ID}"
GATE = "image-preflight.test/queue"


def _node(role: str) -> str:
    return f"place-{role}-{ID}"


@pytest.fixture(scope="module")
def cluster(control_plane, deployed, tmp_path_factory):
    """Five nodes of one pool, a RuntimeClass for the sandbox node, and `serve` deciding."""
    core = control_plane.core()
    node_v1 = k8s.NodeV1Api(core.api_client)
    create_node(control_plane, _node("a"), labels=POOL, taints=[],
                images=[containerd_names(HELD, "a"), containerd_names(ONLY_A, "b"), [FILLER]])
    create_node(control_plane, _node("b"), labels=POOL, taints=[], unschedulable=True,
                images=[containerd_names(HELD, "a"), [FILLER]])
    create_node(control_plane, _node("c"), labels=POOL, taints=[DEDICATED_TAINT], images=[[FILLER]])
    create_node(control_plane, _node("d"), labels=POOL, taints=[], images=[containerd_names(HELD, "a"), [FILLER]])
    create_node(control_plane, _node("s"), labels={**POOL, "image-preflight.test/runtime": ID},
                taints=[SANDBOX_TAINT], images=[containerd_names(SANDBOXED, "c"), [FILLER]])
    node_v1.create_runtime_class({
        "metadata": {"name": RUNTIME_CLASS}, "handler": "runc",
        "scheduling": {"nodeSelector": {"image-preflight.test/runtime": ID},
                       "tolerations": [{"key": SANDBOX_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]},
    })
    folder = tmp_path_factory.mktemp("placement")
    kubeconfig = control_plane.service_account_kubeconfig("image-preflight", "image-preflight",
                                                          folder / "sa.kubeconfig")
    served = ServedWebhook(control_plane, deployed, kubeconfig, folder / "serve.log")
    served.start()
    namespace = new_namespace(control_plane, ENFORCE_LABEL)
    try:
        wait_for(lambda: _denied(control_plane, namespace, _job("probe", ONLY_A), dry_run="All"),
                 "the apiserver calls the webhook", timeout_s=60)
        # The webhook lists RuntimeClasses apart from nodes: wait until it decides with this one.
        wait_for(lambda: _created(control_plane, namespace, _job("probe", SANDBOXED, runtime_class=RUNTIME_CLASS),
                                  dry_run="All"), "the webhook knows the RuntimeClass", timeout_s=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserve:\n{served.tail()}") from None
    yield served
    served.stop()
    node_v1.delete_runtime_class(RUNTIME_CLASS)
    core.delete_collection_node(label_selector=f"image-preflight.test/pool={ID}")


@pytest.fixture
def namespace(control_plane, cluster) -> str:
    return new_namespace(control_plane, ENFORCE_LABEL)


def _pod_spec(image: str, *, node_selector: dict | None = None, **fields) -> dict:
    return {"restartPolicy": "Never", "nodeSelector": {**POOL, **(node_selector or {})},
            "containers": [{"name": "agent", "image": image, "imagePullPolicy": "IfNotPresent"}], **fields}


def _job(name: str, image: str, *, suspend: bool = False, runtime_class: str | None = None, **fields) -> dict:
    spec = _pod_spec(image, **fields)
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "suspend": suspend, "template": {"metadata": {"labels": {"app": name}},
                                                                        "spec": spec}}}


def _daemon_set(name: str, image: str) -> dict:
    spec = _pod_spec(image)
    spec["restartPolicy"] = "Always"
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def _create(plane, namespace: str, obj: dict, **options):
    api = plane.core().api_client
    if obj["kind"] == "Job":
        return k8s.BatchV1Api(api).create_namespaced_job(namespace, obj, **options)
    if obj["kind"] == "DaemonSet":
        return k8s.AppsV1Api(api).create_namespaced_daemon_set(namespace, obj, **options)
    return k8s.CoreV1Api(api).create_namespaced_pod(namespace, obj, **options)


def _refusal(call) -> str | None:
    """The message of a 422 from `call`, or None when it succeeded."""
    try:
        call()
    except ApiException as exc:
        assert exc.status == 422, exc.body
        return json.loads(exc.body)["message"]
    return None


def _denied(plane, namespace: str, obj: dict, **options) -> str | None:
    return _refusal(lambda: _create(plane, namespace, obj, **options))


def _created(plane, namespace: str, obj: dict, **options) -> bool:
    return _denied(plane, namespace, obj, **options) is None


def _decision(plane, obj: dict):
    """What the decision core says about `obj` against the live nodes and RuntimeClasses."""
    core = plane.core()
    nodes = core.api_client.sanitize_for_serialization(core.list_node(label_selector=f"image-preflight.test/pool={ID}"))
    inventory = load_snapshot(json.dumps(nodes), source="live", max_images=None)
    runtime_class = k8s.NodeV1Api(core.api_client).read_runtime_class(RUNTIME_CLASS)
    classes = dict([runtime_class_from_object(core.api_client.sanitize_for_serialization(runtime_class))])
    return decide(pod_spec_of(obj), inventory.with_runtime_classes(classes), kind=obj["kind"])


def _bound_nodes(plane, namespace: str, app: str, count: int) -> set[str]:
    core = plane.core()

    def bound():
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        return len(pods) == count and all(p.spec.node_name for p in pods) and {p.spec.node_name for p in pods}

    return wait_for(bound, f"{count} pod(s) of {app} bound to nodes", timeout_s=60)


def test_a_daemonset_runs_on_exactly_the_nodes_the_decision_named(control_plane, namespace):
    """pkg/controller/daemon: the cordoned node takes a daemon pod (its controller tolerates the
    cordon), the tainted ones do not; read as an ordinary pod spec, the cordoned node would be
    left out."""
    daemon_set = _daemon_set("held", HELD)
    decision = _decision(control_plane, daemon_set)
    assert (decision.outcome, set(decision.eligible)) == (Outcome.ALLOW, {_node("a"), _node("b"), _node("d")})
    assert _created(control_plane, namespace, daemon_set)
    assert _bound_nodes(control_plane, namespace, "held", 3) == set(decision.eligible)


def test_a_daemonset_gets_pods_only_where_its_image_is(control_plane, namespace):
    """deploy/ checks Jobs and Pods: the DaemonSet controller's Pod for each node is decided on its
    own, so the node that holds the image gets one and the cordoned and plain nodes that lack it
    get the controller's FailedCreate with the denial. The DaemonSet as a whole is denied by the
    decision (for a webhook that also checks daemonsets)."""
    daemon_set = _daemon_set("only-a", ONLY_A)
    decision = _decision(control_plane, daemon_set)
    assert decision.outcome == Outcome.DENY
    assert {n for v in decision.verdicts for n in v.missing_on} == {_node("b"), _node("d")}
    assert _created(control_plane, namespace, daemon_set)
    core = control_plane.core()

    def refused_nodes():
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=only-a").items
        denials = [e.message for e in events if e.reason == "FailedCreate" and DENIED_PREFIX in e.message]
        return {n for n in (_node("b"), _node("d")) if any(n in m for m in denials)}

    assert wait_for(lambda: refused_nodes() == {_node("b"), _node("d")} and refused_nodes(),
                    "the controller's pods for b and d are denied", timeout_s=60)
    assert _bound_nodes(control_plane, namespace, "only-a", 1) == {_node("a")}


def test_a_job_with_node_name_lands_on_a_cordoned_node_and_is_decided_there(control_plane, namespace):
    """pkg/kubelet/lifecycle/predicate.go: a pod with spec.nodeName skips the scheduler, and the
    kubelet admits it on a cordoned node; it must hold the image there."""
    lacking = _job("named-lacking", ONLY_A, nodeName=_node("b"))
    message = _denied(control_plane, namespace, lacking)
    assert message and message.startswith(DENIED_PREFIX) and _node("b") in message
    holding = _job("named-holding", HELD, nodeName=_node("b"))
    assert _decision(control_plane, holding).eligible == (_node("b"),)
    assert _created(control_plane, namespace, holding)
    assert _bound_nodes(control_plane, namespace, "named-holding", 1) == {_node("b")}


def test_a_runtime_class_sends_the_pod_to_the_node_the_decision_named(control_plane, namespace):
    """plugin/pkg/admission/runtimeclass: the RuntimeClass's selector and toleration take the pod to
    the tainted sandbox node, which holds the image while the pool's other nodes do not."""
    job = _job("sandboxed", SANDBOXED, runtime_class=RUNTIME_CLASS)
    assert _decision(control_plane, job).eligible == (_node("s"),)
    assert _created(control_plane, namespace, job)
    assert _bound_nodes(control_plane, namespace, "sandboxed", 1) == {_node("s")}


def test_a_runtime_class_whose_node_lacks_the_image_is_denied(control_plane, namespace):
    message = _denied(control_plane, namespace, _job("sandboxed-held", HELD, runtime_class=RUNTIME_CLASS))
    assert message and message.startswith(DENIED_PREFIX) and _node("s") in message


def test_a_suspended_job_is_decided_when_resumed_and_runs_once_narrowed(control_plane, namespace):
    """pkg/controller/job: a suspended Job creates no pods. Kueue narrows its selector while
    suspended and resumes it; the resume is what places the pods, so it is what is decided."""
    batch = k8s.BatchV1Api(control_plane.core().api_client)
    assert _created(control_plane, namespace, _job("queued", ONLY_A, suspend=True))
    message = _refusal(lambda: batch.patch_namespaced_job("queued", namespace, {"spec": {"suspend": False}}))
    assert message and message.startswith(DENIED_PREFIX) and _node("d") in message
    assert not control_plane.core().list_namespaced_pod(namespace, label_selector="app=queued").items
    narrowed = {"spec": {"template": {"spec": {"nodeSelector": {**POOL, "kubernetes.io/hostname": _node("a")}}}}}
    batch.patch_namespaced_job("queued", namespace, narrowed)
    batch.patch_namespaced_job("queued", namespace, {"spec": {"suspend": False}})
    assert _bound_nodes(control_plane, namespace, "queued", 1) == {_node("a")}


def test_a_gated_pod_is_decided_when_its_last_gate_is_removed(control_plane, namespace):
    """pkg/scheduler/framework/plugins/schedulinggates: a gated pod is not scheduled, and its
    selector may still be narrowed; removing the last gate is what places it."""
    core = control_plane.core()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gated", "labels": {"app": "gated"}},
           "spec": {**_pod_spec(ONLY_A), "schedulingGates": [{"name": GATE}]}}
    assert _created(control_plane, namespace, pod)
    message = _refusal(lambda: core.patch_namespaced_pod("gated", namespace, {"spec": {"schedulingGates": None}}))
    assert message and message.startswith(DENIED_PREFIX) and _node("d") in message
    assert core.read_namespaced_pod("gated", namespace).spec.node_name is None
    core.patch_namespaced_pod("gated", namespace, {"spec": {"nodeSelector": {"kubernetes.io/hostname": _node("a")}}})
    core.patch_namespaced_pod("gated", namespace, {"spec": {"schedulingGates": None}})
    assert _bound_nodes(control_plane, namespace, "gated", 1) == {_node("a")}
