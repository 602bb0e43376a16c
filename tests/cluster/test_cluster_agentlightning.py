"""The chart's agentlightningOnly on a real control plane, against the Jobs agent-lightning
really creates: its own SWE-smith template rendered through build_job_spec (tests/agent_lightning.py),
created with kr8s as its controller creates them, and the Pods the real Job controller makes of them.

The template selects no node, so every untainted node is eligible: two untainted CPU nodes and a GPU
node tainted nvidia.com/gpu:NoSchedule, as in examples/swe-smith/nodes.json."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.kube.status import status_of
from tests.agent_lightning import JOB_NAME_PREFIX, MANAGED_BY, TEMPLATE, build_job_spec, example_row, fails_at_once
from tests.builders.stalls import DENIED_PREFIX, ENFORCE_LABEL, containerd_names
from tests.chart import API_ONLY, apply, merged, secret_values
from tests.cluster.kube_calls import kr8s_create
from tests.controlplane.cluster import create_node, delete_namespaces, new_namespace, set_node_images, wait_for
from tests.controlplane.webhook import ServedWebhook

ID = uuid.uuid4().hex[:8]
NODE_LABEL = {"image-preflight.test/agentlightning": ID}
CPU = (f"agl-cpu-a-{ID}", f"agl-cpu-b-{ID}")
GPU = f"agl-gpu-{ID}"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

# The example's row whose image no CPU node holds (only the tainted GPU node, where no rollout lands).
MISSING_ROW = example_row("getmoto__moto.694ce1f4.func_pm_remove_cond__658cda14")
MISSING = MISSING_ROW["image_name"] + ":openai"
HELD_REPOSITORY = f"jyangballin/swesmith.x86_64.agl_1776_held.{ID}"
LATER_REPOSITORY = f"jyangballin/swesmith.x86_64.agl_1776_later.{ID}"  # held, then collected
HELD, LATER = HELD_REPOSITORY + ":openai", LATER_REPOSITORY + ":openai"


def _row(repository: str) -> dict:
    return {**MISSING_ROW, "image_name": repository}


def _rollout_job(row: dict, namespace: str) -> dict:
    """What agent-lightning's controller submits for `row`: the real template, build_job_spec."""
    template = TEMPLATE.read_text(encoding="utf-8")
    return build_job_spec(template, row, rollout_id=uuid.uuid4().hex, namespace=namespace)


def _unlabelled(job: dict, name: str | None = None) -> dict:
    """The same Job without the managed-by label (and, given `name`, renamed)."""
    metadata = {**job["metadata"], "labels": {k: v for k, v in job["metadata"]["labels"].items() if k != MANAGED_BY[0]}}
    if name is not None:
        metadata["name"] = name
    return {**job, "metadata": metadata}


@dataclass
class Rollouts:
    plane: object
    webhook: ServedWebhook
    namespaces: list[str] = field(default_factory=list)

    def namespace(self) -> str:
        name = new_namespace(self.plane, ENFORCE_LABEL)
        self.namespaces.append(name)
        return name

    def decisions(self, namespace: str) -> list[tuple[str, str, str]]:
        return [(d["kind"], d["name"], d["decision"]) for d in self.webhook.decisions() if d["namespace"] == namespace]


def _created(plane, namespace: str, job: dict) -> bool:
    try:
        k8s.BatchV1Api(plane.core().api_client).create_namespaced_job(namespace, job, dry_run="All")
    except ApiException as exc:
        if exc.status == 422:
            return False
        raise
    return True


@pytest.fixture(scope="module")
def rollouts(control_plane, deployed, tmp_path_factory):
    """The chart with agentlightningOnly, `serve` deciding, and the nodes; afterwards the
    namespaces and nodes are deleted and the chart applied again as it was."""
    core = control_plane.core()
    folder = tmp_path_factory.mktemp("agentlightning")
    kubeconfig = control_plane.service_account_kubeconfig("image-preflight", "image-preflight",
                                                          folder / "sa.kubeconfig")
    served = ServedWebhook(control_plane, deployed, kubeconfig, folder / "serve.log")
    state = Rollouts(control_plane, served)
    values = merged(API_ONLY, secret_values(deployed))
    try:
        cpu_images = [containerd_names(HELD, "a"), containerd_names(LATER, "b")]
        for name in CPU:
            create_node(control_plane, name, labels=NODE_LABEL, taints=[], images=cpu_images)
        create_node(control_plane, GPU, labels=NODE_LABEL, taints=[GPU_TAINT], images=[containerd_names(MISSING, "c")])
        apply(control_plane, merged(values, {"agentlightningOnly": True}))
        served.start()
        probe = state.namespace()
        job = _rollout_job(MISSING_ROW, probe)
        # Called for agent-lightning's Job, and no longer for the same Job without its label: the
        # apiserver's informer has the match condition.
        try:
            wait_for(lambda: not _created(control_plane, probe, job)
                     and _created(control_plane, probe, _unlabelled(job, "unrelated-probe")),
                     "the component's match condition is in force", timeout_s=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nserve:\n{served.tail()}") from None
        yield state
    finally:
        served.stop()
        delete_namespaces(control_plane, state.namespaces)
        core.delete_collection_node(label_selector=",".join(f"{k}={v}" for k, v in NODE_LABEL.items()))
        apply(control_plane, values)
    hook = k8s.AdmissionregistrationV1Api(core.api_client).read_validating_webhook_configuration(
        "image-preflight").webhooks[0]
    assert hook.match_conditions is None, "the chart's defaults were not applied again"


def _failed_creates(plane, namespace: str, job: str) -> list[str]:
    events = plane.core().list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Job,involvedObject.name={job},reason=FailedCreate").items
    return [e.message for e in events]


def test_a_job_rendered_from_agent_lightnings_template_with_a_missing_image_is_denied(control_plane, rollouts):
    namespace = rollouts.namespace()
    job = _rollout_job(MISSING_ROW, namespace)
    pod_spec = job["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod_spec and "tolerations" not in pod_spec

    error = kr8s_create(control_plane, namespace, job)
    assert isinstance(error, str), error
    # agentlightning/controller/k8s_reconciler.py, K8sReconciler._create_job: fails the rollout at once,
    # with error_message "Invalid Job spec: " + this text (the apiserver's Status message).
    assert fails_at_once(error), error
    assert error.startswith(DENIED_PREFIX), error
    assert f"image '{MISSING}' (container 'agent', imagePullPolicy IfNotPresent)" in error
    eligible = error.split("is absent from eligible node(s) ", 1)[1].split(";", 1)[0].split(", ")
    assert set(CPU) <= set(eligible) and GPU not in eligible  # the GPU node holds it, but is tainted
    with pytest.raises(ApiException) as gone:
        k8s.BatchV1Api(control_plane.core().api_client).read_namespaced_job(job["metadata"]["name"], namespace)
    assert gone.value.status == 404
    assert rollouts.decisions(namespace) == [("Job", job["metadata"]["name"], "deny")]


def test_the_pods_the_job_controller_creates_for_a_rollout_job_are_decided(control_plane, rollouts):
    """A rollout Job whose managed-by label is gone (so that only its Pods can match): the apiserver
    gives its template batch.kubernetes.io/job-name=agl-rollout-..., the Job controller copies it onto
    each Pod, and the webhook denies the Pod."""
    namespace = rollouts.namespace()
    job = _unlabelled(_rollout_job(MISSING_ROW, namespace))
    name = job["metadata"]["name"]
    batch = k8s.BatchV1Api(control_plane.core().api_client)
    batch.create_namespaced_job(namespace, job)
    assert batch.read_namespaced_job(name, namespace).spec.template.metadata.labels[JOB_NAME_LABEL] == name

    messages = wait_for(lambda: _failed_creates(control_plane, namespace, name), "the Job controller's FailedCreate")
    assert all(m.startswith(f"Error creating: {DENIED_PREFIX}") and MISSING in m for m in messages), messages
    assert control_plane.core().list_namespaced_pod(namespace).items == []
    decided = rollouts.decisions(namespace)
    assert decided and {(kind, decision) for kind, _, decision in decided} == {("Pod", "deny")}, decided


def test_a_rollout_pod_whose_image_left_the_nodes_after_its_job_was_admitted_is_denied(control_plane, rollouts):
    """Admitted while both CPU nodes held the image, then the kubelets collected it: the Pod the Job
    controller creates next is decided against the nodes as they are then."""
    namespace = rollouts.namespace()
    core = control_plane.core()
    batch = k8s.BatchV1Api(core.api_client)
    job = _rollout_job(_row(LATER_REPOSITORY), namespace)
    job["spec"]["completions"] = 2  # room for a second Pod once parallelism allows it
    name = job["metadata"]["name"]
    batch.create_namespaced_job(namespace, job)

    def pods() -> list:
        return core.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={name}").items

    (first,) = wait_for(pods, "the first Pod")
    assert ("Pod", first.metadata.name, "allow") in rollouts.decisions(namespace)

    for node in CPU:
        set_node_images(control_plane, node, [containerd_names(HELD, "a")])
    wait_for(lambda: not _created(control_plane, namespace, _rollout_job(_row(LATER_REPOSITORY), namespace)),
             "the webhook sees the image gone")
    batch.patch_namespaced_job(name, namespace, {"spec": {"parallelism": 2}})

    messages = wait_for(lambda: _failed_creates(control_plane, namespace, name), "the second Pod's FailedCreate")
    assert all(f"Error creating: {DENIED_PREFIX}" in m and LATER in m for m in messages), messages
    assert [p.metadata.name for p in pods()] == [first.metadata.name]


def test_a_pod_update_that_drops_the_job_name_label_is_still_decided(control_plane, rollouts):
    """The condition matches the old object as well as the new one, as an objectSelector would."""
    namespace = rollouts.namespace()
    core = control_plane.core()
    job_name = JOB_NAME_PREFIX + uuid.uuid4().hex

    def pod(name: str, labels: dict) -> dict:
        return {"metadata": {"name": name, "labels": labels},
                "spec": {"nodeName": CPU[0], "restartPolicy": "Never",
                         "containers": [{"name": "agent", "image": HELD, "imagePullPolicy": "IfNotPresent"}]}}

    drop_label_and_swap_image = {"metadata": {"labels": {JOB_NAME_LABEL: None}},
                                 "spec": {"containers": [{"name": "agent", "image": MISSING}]}}

    core.create_namespaced_pod(namespace, pod("rollout", {JOB_NAME_LABEL: job_name, "app": "agl-rollout"}))
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("rollout", namespace, drop_label_and_swap_image)
    assert caught.value.status == 422
    message = status_of(caught.value)["message"]
    assert message.startswith(DENIED_PREFIX) and MISSING in message
    assert core.read_namespaced_pod("rollout", namespace).spec.containers[0].image == HELD

    # A Pod that never carried the label: neither its creation nor the same update reaches the webhook.
    core.create_namespaced_pod(namespace, pod("other", {"app": "agl-rollout"}))
    core.patch_namespaced_pod("other", namespace, drop_label_and_swap_image)
    assert core.read_namespaced_pod("other", namespace).spec.containers[0].image == MISSING
    assert rollouts.decisions(namespace) == [("Pod", "rollout", "allow"), ("Pod", "rollout", "deny")]


def test_a_job_without_agent_lightnings_labels_and_its_pods_are_not_checked(control_plane, rollouts):
    namespace = rollouts.namespace()
    job = _rollout_job(MISSING_ROW, namespace)
    name = f"batch-{uuid.uuid4().hex[:8]}"
    job["metadata"] = {"name": name, "namespace": namespace}  # no agentlightning labels, another name
    k8s.BatchV1Api(control_plane.core().api_client).create_namespaced_job(namespace, job)
    core = control_plane.core()
    wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={name}").items,
             "the Job controller creates the Pod")
    assert rollouts.decisions(namespace) == []
