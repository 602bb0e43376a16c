"""The watchdog failing a Job whose Pod cannot get its sandbox (pause) image, on the real control
plane: the kubelet's FailedCreatePodSandBox Event, as its legacy recorder writes it, confirmed by
the node's own NodeImages, and not another sandbox failure, which is the kubelet's to retry
(tests/core/test_sandbox.py has the decision); and the same words written by anyone else, which
fail no Job: from another namespace naming the Pod's uid, or in the Pod's own namespace while the
node's agent says its runtime holds the image, or where no agent reports the node."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION, runtime_object
from image_preflight.core.watchdog import job_failure
from tests.builders.stalls import (
    ENFORCE_LABEL,
    SANDBOX_MESSAGES,
    failed_condition,
    job_manifest,
    kubelet_event,
)
from tests.builders.stalls import (
    SANDBOX_IMAGE as PAUSE,
)
from tests.cluster.watchdog_process import BOUND_S, GRACE_S, FakeKubelet, Watchdog
from tests.controlplane.cluster import create_node, delete_namespaces, new_namespace, wait_for


@pytest.fixture
def watchdog_cluster(service_accounts, tmp_path):
    """The watchdog as a process with the chart's ServiceAccount and role for it, a node for the
    Pods, and FakeKubelet ending the Pods the Job controller deletes."""
    plane = service_accounts
    kubeconfig = plane.service_account_kubeconfig("image-preflight", "image-preflight-watchdog",
                                                  tmp_path / "watchdog.kubeconfig")
    node_name = f"sandboxless-{uuid.uuid4().hex[:8]}"
    create_node(plane, node_name, taints=[])
    namespace = new_namespace(plane, ENFORCE_LABEL)
    kubelet = FakeKubelet(plane).start()
    kubelet.namespaces.append(namespace)
    watchdog = Watchdog(plane, kubeconfig, tmp_path / "watchdog.log")
    try:
        watchdog.start()
        yield plane, watchdog, node_name, namespace
    finally:
        watchdog.stop()
        kubelet.stop()
        delete_namespaces(plane, [namespace])
        plane.core().delete_node(node_name)
        _delete_node_images(plane, node_name)


def _node_says(plane, node_name: str, *, present: bool) -> None:
    """The node agent's NodeImages for `node_name`, current, saying whether the runtime holds PAUSE."""
    k8s.CustomObjectsApi(plane.core().api_client).create_cluster_custom_object(GROUP, VERSION, PLURAL, runtime_object(
        node_name, [], observed_at=time.time(), lease_seconds=300, sandbox_image={"name": PAUSE, "present": present}))


def _delete_node_images(plane, node_name: str) -> None:
    try:
        k8s.CustomObjectsApi(plane.core().api_client).delete_cluster_custom_object(GROUP, VERSION, PLURAL, node_name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _job_with_bound_pod(plane, namespace: str, name: str, node_name: str):

    manifest = job_manifest(name, "swe-smith/task-sandboxless:openai")
    manifest["spec"]["template"]["spec"]["nodeName"] = node_name  # bound at once, wherever other tests' nodes are
    k8s.BatchV1Api(plane.core().api_client).create_namespaced_job(namespace, manifest)
    (found,) = wait_for(lambda: plane.core().list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={name}").items, f"the Pod of {name}")
    return found


def _kubelet_event(plane, pod, node_name: str, message: str, **where) -> None:
    """The Event the kubelet's legacy recorder writes for a failed RunPodSandbox (or its copy
    written elsewhere: kubelet_event's in_namespace)."""
    event = kubelet_event(pod, node_name, message, now=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **where)
    plane.core().create_namespaced_event(event["metadata"]["namespace"], event)


def _untouched(plane, namespace: str, name: str) -> None:
    job = plane.core().api_client.sanitize_for_serialization(
        k8s.BatchV1Api(plane.core().api_client).read_namespaced_job(name, namespace))
    assert failed_condition(job) is None and "activeDeadlineSeconds" not in job["spec"], job["status"]
    assert job_failure.ANNOTATION not in (job["metadata"].get("annotations") or {})


def test_the_watchdog_fails_a_job_whose_pod_cannot_get_its_sandbox_image(watchdog_cluster):

    plane, watchdog, node_name, namespace = watchdog_cluster
    batch = k8s.BatchV1Api(plane.core().api_client)
    _node_says(plane, node_name, present=False)  # what the node's agent reads from its runtime over CRI
    stuck = _job_with_bound_pod(plane, namespace, "sandboxless", node_name)
    network = _job_with_bound_pod(plane, namespace, "network", node_name)
    _kubelet_event(plane, stuck, node_name, SANDBOX_MESSAGES["containerd 2.3 Start"])
    # Another sandbox failure (the network plugin) is the kubelet's to retry: left alone.
    _kubelet_event(plane, network, node_name, 'Failed to create pod sandbox: rpc error: code = Unknown desc = failed '
                   'to setup network for sandbox "5b1e2a": plugin type="calico" failed (add): connection is '
                   'unauthorized')
    start = time.monotonic()

    def failed():
        return failed_condition(plane.core().api_client.sanitize_for_serialization(
            batch.read_namespaced_job("sandboxless", namespace)))

    condition = wait_for(failed, "the Job fails", timeout_s=BOUND_S)
    assert condition["reason"] == "DeadlineExceeded" and time.monotonic() - start >= GRACE_S - 0.5
    job = batch.read_namespaced_job("sandboxless", namespace)
    recorded = json.loads(job.metadata.annotations[job_failure.ANNOTATION])
    assert (recorded["action"], recorded["reason"], recorded["node"], recorded["image"], recorded["pod"]) == (
        "failed", "FailedCreatePodSandBox", node_name, PAUSE, stuck.metadata.name)
    (event,) = [e for e in plane.core().list_namespaced_event(
        namespace, field_selector="involvedObject.kind=Job,involvedObject.name=sandboxless").items
        if e.reason == job_failure.EVENT_REASON]
    assert event.type == "Warning" and node_name in event.message and PAUSE in event.message
    time.sleep(1.0)  # acted on one after the other: the second would be done by now
    other = batch.read_namespaced_job("network", namespace)
    assert failed_condition(plane.core().api_client.sanitize_for_serialization(other)) is None
    assert job_failure.ANNOTATION not in (other.metadata.annotations or {})
    assert 'reason="FailedCreatePodSandBox"' in watchdog.metrics()


def test_a_sandbox_event_from_another_namespace_naming_a_pods_uid_fails_no_job(watchdog_cluster):
    """Written where its writer may write Events, naming that namespace (so the apiserver takes it)
    and the uid of a bound Pod elsewhere: the node's agent even says the sandbox image is missing,
    and still the report is not about that Pod."""
    plane, watchdog, node_name, namespace = watchdog_cluster
    attacker = new_namespace(plane)  # not opted in
    try:
        _node_says(plane, node_name, present=False)
        victim = _job_with_bound_pod(plane, namespace, "victim", node_name)
        time.sleep(1.0)  # the watchdog has the Pod, so it says why it ignores the report
        _kubelet_event(plane, victim, node_name, SANDBOX_MESSAGES["containerd 2.3 Start"], in_namespace=attacker)
        time.sleep(GRACE_S + 2)
        _untouched(plane, namespace, "victim")
        assert [x for x in watchdog.lines() if x.get("job") == "victim"] == []
        (line,) = [x for x in watchdog.lines() if x.get("action") == "ignored"]
        assert line["detail"] == (f"untrusted: Event in {attacker} names Pod {attacker}/{victim.metadata.name} uid "
                                  f"{victim.metadata.uid}, which is Pod {namespace}/{victim.metadata.name}")
    finally:
        delete_namespaces(plane, [attacker])


def test_a_sandbox_event_in_the_pods_namespace_fails_no_job_unless_the_nodes_agent_confirms_it(watchdog_cluster):
    """The kubelet's words, reporter and host, written by anyone who may write Events in the Pod's
    namespace: on a node whose agent says its runtime holds the sandbox image, and on a node no
    agent reports, the Job is left running and the watchdog says why."""
    plane, watchdog, node_name, namespace = watchdog_cluster
    unreported = f"unreported-{uuid.uuid4().hex[:8]}"
    create_node(plane, unreported, taints=[])
    try:
        _node_says(plane, node_name, present=True)
        held = _job_with_bound_pod(plane, namespace, "held", node_name)
        nobody = _job_with_bound_pod(plane, namespace, "nobody", unreported)
        for pod, node in ((held, node_name), (nobody, unreported)):
            _kubelet_event(plane, pod, node, SANDBOX_MESSAGES["containerd 2.3 Start"])

        def handled() -> list[dict]:
            found = [x for x in watchdog.lines() if x.get("job") in ("held", "nobody")]
            return found if len(found) == 2 else []

        lines = wait_for(handled, "the watchdog handles both", timeout_s=BOUND_S)
        assert {(x["job"], x["action"], x.get("detail")) for x in lines} == {
            ("held", "skipped", f"not confirmed: node {node_name}'s NodeImages says its runtime holds its sandbox "
                                f"image {PAUSE}"),
            ("nobody", "skipped", f"not confirmed: node {unreported} has no NodeImages (no node agent reports its "
                                  "runtime)")}
        time.sleep(1.0)
        for name in ("held", "nobody"):
            _untouched(plane, namespace, name)
    finally:
        plane.core().delete_node(unreported)
