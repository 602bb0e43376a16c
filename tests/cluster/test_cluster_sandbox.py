"""The watchdog failing a Job whose Pod cannot get its sandbox (pause) image, on the real control
plane: the kubelet's FailedCreatePodSandBox Event, as its legacy recorder writes it, and not another
sandbox failure, which is the kubelet's to retry (tests/core/test_sandbox.py has the decision)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kubernetes import client as k8s

from image_preflight.core.watchdog import job_failure
from tests.builders.stalls import ENFORCE_LABEL, SANDBOX_MESSAGES, failed_condition, job_manifest
from tests.cluster.watchdog_process import BOUND_S, FakeKubelet, GRACE_S, Watchdog
from tests.controlplane.cluster import create_node, delete_namespaces, new_namespace, wait_for

PAUSE = "registry.k8s.io/pause:3.10.1"


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


def _job_with_bound_pod(plane, namespace: str, name: str, node_name: str):

    manifest = job_manifest(name, "swe-smith/task-sandboxless:openai")
    manifest["spec"]["template"]["spec"]["nodeName"] = node_name  # bound at once, wherever other tests' nodes are
    k8s.BatchV1Api(plane.core().api_client).create_namespaced_job(namespace, manifest)
    (found,) = wait_for(lambda: plane.core().list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={name}").items, f"the Pod of {name}")
    return found


def _kubelet_event(plane, pod, node_name: str, message: str) -> None:
    """The Event the kubelet's legacy recorder writes for a failed RunPodSandbox."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    plane.core().create_namespaced_event(pod.metadata.namespace, {
        "metadata": {"name": f"{pod.metadata.name}.{uuid.uuid4().hex[:16]}", "namespace": pod.metadata.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                           "namespace": pod.metadata.namespace, "uid": pod.metadata.uid},
        "reason": "FailedCreatePodSandBox", "message": message, "type": "Warning",
        "source": {"component": "kubelet", "host": node_name}, "firstTimestamp": now, "lastTimestamp": now,
        "count": 1})


def test_the_watchdog_fails_a_job_whose_pod_cannot_get_its_sandbox_image(watchdog_cluster):

    plane, watchdog, node_name, namespace = watchdog_cluster
    batch = k8s.BatchV1Api(plane.core().api_client)
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
