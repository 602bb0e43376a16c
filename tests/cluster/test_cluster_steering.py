"""Steering on the real control plane: the chart with webhook.steering.enabled, `serve --steer`
running as its ServiceAccount, the real Job controller and kube-scheduler.

Three schedulable nodes and a Job with parallelism 5 and no nodeSelector (agent-lightning's rollout
shape): without steering the scheduler spreads its Pods over all three; with it every Pod is bound
to a node that holds the image, and a Job whose image no node holds is denied at create."""

from __future__ import annotations

import uuid

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.core.admission.steering import STEERED_TO
from tests.builders.stalls import DENIED_PREFIX, ENFORCE_LABEL, containerd_names, job_manifest
from tests.chart import API_ONLY, apply, merged, secret_values
from tests.controlplane.cluster import create_node, delete_namespaces, new_namespace, open_nodes, wait_for
from tests.controlplane.webhook import ServedWebhook

ID = uuid.uuid4().hex[:8]
NODES = tuple(f"steer-{n}-{ID}" for n in "abc")
ON_ONE = f"swe-smith/task-steer-one.{ID}:openai"  # on NODES[0]
ON_TWO = f"swe-smith/task-steer-two.{ID}:openai"  # on NODES[0] and NODES[1]
ON_ALL = f"swe-smith/task-steer-all.{ID}:openai"
ON_NONE = f"swe-smith/task-steer-none.{ID}:openai"
PODS = 5


@pytest.fixture(scope="module")
def steered(control_plane, deployed, tmp_path_factory):
    folder = tmp_path_factory.mktemp("steering")
    values = merged(API_ONLY, secret_values(deployed))
    core = control_plane.core()
    kubeconfig = control_plane.service_account_kubeconfig("image-preflight", "image-preflight",
                                                          folder / "sa.kubeconfig")
    served = ServedWebhook(control_plane, deployed, kubeconfig, folder / "serve.log", "--steer")
    namespaces: list[str] = []
    try:
        images = {NODES[0]: [ON_ONE, ON_TWO, ON_ALL], NODES[1]: [ON_TWO, ON_ALL], NODES[2]: [ON_ALL]}
        for name, held in images.items():
            create_node(control_plane, name,
                        images=[containerd_names(image, "abcdef"[i]) for i, image in enumerate(held)], taints=[])
        apply(control_plane, merged(values, {"webhook": {"steering": {"enabled": True}}}))
        served.start()
        namespace = new_namespace(control_plane, ENFORCE_LABEL)
        namespaces.append(namespace)
        # The apiserver picks up both configurations from its informers: wait until it steers. Until
        # it calls /mutate, /validate alone denies the probe (ON_ONE is absent from two nodes).
        probe = {"metadata": {"generateName": "probe-"}, "spec": {"containers": [
            {"name": "c", "image": ON_ONE, "imagePullPolicy": "IfNotPresent"}]}}

        def steers() -> str | None:
            try:
                created = core.create_namespaced_pod(namespace, probe, dry_run="All")
            except ApiException as exc:
                if exc.status == 422 and DENIED_PREFIX in (exc.body or ""):
                    return None
                raise
            return (created.metadata.annotations or {}).get(STEERED_TO)

        try:
            wait_for(steers, "the apiserver calls /mutate", timeout_s=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; nodes a Pod may land on: {sorted(open_nodes())}\n"
                                 f"serve:\n{served.tail()}") from None
        yield control_plane, served, namespaces
    finally:
        served.stop()
        delete_namespaces(control_plane, namespaces)
        apply(control_plane, values)  # steering off again: its configuration goes
        assert not k8s.AdmissionregistrationV1Api(core.api_client).list_mutating_webhook_configuration(
            field_selector="metadata.name=image-preflight").items
        for name in NODES:
            core.delete_node(name)


def _run(steered, image: str) -> tuple[str, list]:
    """Create a rollout-shaped Job with parallelism 5 in a new opted-in namespace; its bound Pods."""
    plane, _, namespaces = steered
    namespace = new_namespace(plane, ENFORCE_LABEL)
    namespaces.append(namespace)
    core = plane.core()
    k8s.BatchV1Api(core.api_client).create_namespaced_job(namespace, job_manifest("rollout", image, parallelism=PODS))
    pods = wait_for(lambda: (found := [p for p in core.list_namespaced_pod(namespace).items if p.spec.node_name])
                    and len(found) == PODS and found, f"{PODS} Pods bound", timeout_s=90)
    return namespace, pods


def test_every_pod_is_bound_to_the_one_node_that_holds_the_image(steered):
    namespace, pods = _run(steered, ON_ONE)
    assert {p.spec.node_name for p in pods} == {NODES[0]}
    assert {p.metadata.annotations[STEERED_TO] for p in pods} == {"1 node"}
    served = steered[1]
    lines = [d for d in served.decisions() if d["namespace"] == namespace]
    assert {(d["kind"], d["decision"]) for d in lines} >= {("Job", "allow"), ("Pod", "steered"), ("Pod", "allow")}


def test_pods_are_bound_only_to_the_two_nodes_that_hold_the_image(steered):
    _, pods = _run(steered, ON_TWO)
    assert {p.spec.node_name for p in pods} <= set(NODES[:2])
    assert {p.metadata.annotations[STEERED_TO] for p in pods} == {"2 nodes"}
    for pod in pods:
        terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
        assert [t.match_fields[0].values for t in terms] == [[NODES[0]], [NODES[1]]]


def test_a_pod_whose_image_every_node_holds_is_not_steered(steered):
    namespace, pods = _run(steered, ON_ALL)
    assert all(STEERED_TO not in (p.metadata.annotations or {}) and p.spec.affinity is None for p in pods)
    lines = [d for d in steered[1].decisions() if d["namespace"] == namespace and d["decision"] == "not-steered"]
    assert {d["detail"] for d in lines} == {"all-eligible-nodes-hold"}


def test_a_job_whose_image_no_node_holds_is_denied_at_create(steered):
    plane, _, namespaces = steered
    namespace = new_namespace(plane, ENFORCE_LABEL)
    namespaces.append(namespace)
    with pytest.raises(ApiException) as caught:
        k8s.BatchV1Api(plane.core().api_client).create_namespaced_job(
            namespace, job_manifest("rollout", ON_NONE, parallelism=PODS))
    assert caught.value.status == 422
    message = yaml.safe_load(caught.value.body)["message"]
    assert message.startswith(DENIED_PREFIX) and ON_NONE in message
