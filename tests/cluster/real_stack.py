"""The chart on the real node's control plane, and what its tests do with it: rollouts, doctor, the agent."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.core.watchdog import job_failure
from tests.agent_lightning import TEMPLATE, build_job_spec, example_row
from tests.builders.rows import example_row_id
from tests.builders.stalls import ENFORCE_LABEL
from tests.chart import API_ONLY, apply, merged, secret_values
from tests.cluster.watchdog_process import Watchdog
from tests.controlplane.cluster import new_namespace, terminate, wait_for
from tests.controlplane.webhook import ServedWebhook
from tests.node.images import swe_smith_image
from tests.node.real_node import NODE_NAME, RealNode

DENIED = 'admission webhook "validate.image-preflight.io" denied the request: invalid:'
HELD = swe_smith_image("pandas-dev", "pandas", "95280573e1")
ABSENT = swe_smith_image("getmoto", "moto", "694ce1f4a1")
GRACE_S = 3.0
WATCHDOG_BOUND_S = GRACE_S + 40.0  # ErrImagePull within ~2 s, then the grace, then the Job controller


def apply_without_pods(plane, values: dict) -> None:
    """The chart applied with `values`, less its Deployments and DaemonSet: their image is not on
    the node, and their Pods would only wait there."""
    apply(plane, values, workloads=False)


class Stack:
    def __init__(self, node: RealNode, served: ServedWebhook, watchdog: Watchdog, folder: Path, values: dict) -> None:
        self.node, self.served, self.watchdog, self.folder = node, served, watchdog, folder
        self.values = values  # what the chart was applied with
        self.plane = node.plane
        self.core = self.plane.core()
        self.batch = k8s.BatchV1Api(self.core.api_client)
        self.namespaces: list[str] = []

    def namespace(self, opted_in: bool = True) -> str:
        name = new_namespace(self.plane, ENFORCE_LABEL if opted_in else {}, rollout_scripts=True)
        self.namespaces.append(name)
        return name

    def rollout(self, image: str, rollout_id: str | None = None) -> dict:
        """The Job agent-lightning's controller renders for a SWE-smith row naming `image`."""
        row = dict(example_row(example_row_id()), image_name=image.removesuffix(":openai"))
        return build_job_spec(TEMPLATE.read_text(), row, rollout_id=rollout_id or uuid.uuid4().hex[:8],
                              namespace=None)

    def create(self, namespace: str, job: dict) -> dict:
        return self.batch.create_namespaced_job(namespace, job).to_dict()

    def dry_run(self, namespace: str, image: str, **overrides) -> tuple[int, str]:
        """`kubectl create --dry-run=server` of a rollout Job: exit code and stderr (warnings)."""
        job = self.rollout(image)
        job["spec"].update(overrides)
        done = self.plane.kubectl("-n", namespace, "create", "--dry-run=server", "-f", "-",
                                  input=json.dumps(job), check=False)
        return done.returncode, done.stderr

    def job_condition(self, namespace: str, name: str, kind: str) -> dict | None:
        job = self.core.api_client.sanitize_for_serialization(self.batch.read_namespaced_job(name, namespace))
        return next((c for c in job.get("status", {}).get("conditions") or []
                     if c["type"] == kind and c["status"] == "True"), None)

    def pods(self, namespace: str, job: str) -> list:
        return self.core.list_namespaced_pod(namespace, label_selector=f"batch.kubernetes.io/job-name={job}").items

    def waiting_reasons(self, namespace: str, job: str) -> set[str]:
        return {s.state.waiting.reason for p in self.pods(namespace, job)
                for s in (p.status.container_statuses or ()) if s.state and s.state.waiting}

    @contextlib.contextmanager
    def webhook_unreachable(self):
        """The webhook's Service leads nowhere: `failurePolicy: Ignore` admits what it would deny."""
        self.plane.network.withdraw(self.served.address)
        try:
            yield
        finally:
            self.plane.network.expose(self.served.address, self.served.port)


@contextlib.contextmanager
def running_stack(node: RealNode, certs: Path, folder: Path) -> Iterator[Stack]:
    """The chart on the real node's control plane (steering on, the certificate of `image-preflight
    certs` in `certs`), with `serve --steer` and `watchdog` as host processes of their own
    ServiceAccounts, their kubeconfigs and logs in `folder`. The chart's own Pods are not started
    (their image is not on the node): its Deployments and DaemonSet are left out."""
    plane = node.plane
    folder.mkdir(parents=True, exist_ok=True)
    values = merged(API_ONLY, secret_values(certs), {"webhook": {"steering": {"enabled": True}}})
    apply_without_pods(plane, values)
    served = ServedWebhook(plane, certs, plane.service_account_kubeconfig(
        "image-preflight", "image-preflight", folder / "serve.kubeconfig"), folder / "serve.log", "--steer")
    watchdog = Watchdog(plane, plane.service_account_kubeconfig(
        "image-preflight", "image-preflight-watchdog", folder / "watchdog.kubeconfig"), folder / "watchdog.log")
    served.start()
    watchdog.start()
    node.import_images([HELD])
    node.wait_in_status(HELD)
    stack = Stack(node, served, watchdog, folder, values)
    wait_for(lambda: stack.dry_run(stack.namespace(), ABSENT)[0] != 0, "the apiserver calls the webhook")
    try:
        yield stack
    finally:
        watchdog.stop()
        served.stop()
        for namespace in stack.namespaces:
            plane.core().delete_namespace(namespace)


def job_name(job: dict) -> str:
    return job["metadata"]["name"]


def stuck_job_fails(stack, namespace: str, job: dict, expected: set[str]) -> tuple[dict, set[str]]:
    name = job_name(job)
    seen: set[str] = set()

    def failed():
        seen.update(stack.waiting_reasons(namespace, name))
        return stack.job_condition(namespace, name, "Failed")

    # Unreachable until the Job fails: else the webhook denies the Job controller's Pod, and the
    # watchdog fails the Job at that FailedCreate before any kubelet status.
    with stack.webhook_unreachable():
        stack.create(namespace, job)
        condition = wait_for(failed, f"Job {name} Failed", timeout_s=WATCHDOG_BOUND_S, interval_s=0.2)
    assert condition["reason"] == "DeadlineExceeded"
    assert not expected or seen & expected, seen
    annotations = stack.batch.read_namespaced_job(name, namespace).metadata.annotations or {}
    recorded = json.loads(annotations[job_failure.ANNOTATION])
    assert recorded["action"] == "failed" and recorded["node"] == NODE_NAME
    # The Job controller deletes the Pod; the real kubelet ends it and lets it go.
    wait_for(lambda: stack.pods(namespace, name) == [], f"the Pods of {name} are gone", timeout_s=60)
    return recorded, seen


def doctor(stack) -> str:
    """`image-preflight doctor` as a user runs it beside the cluster; its findings."""
    namespace = stack.namespace()
    done = subprocess.run([sys.executable, "-m", "image_preflight", "doctor", "--kubeconfig",
                           str(stack.plane.kubeconfig), "--namespace", namespace,
                           "--webhook-address", f"127.0.0.1:{stack.served.port}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


@contextlib.contextmanager
def running_agent(stack, folder: Path, *extra: str):
    kubeconfig = stack.plane.service_account_kubeconfig("image-preflight-agent", "image-preflight-agent",
                                                        folder / "agent.kubeconfig")
    log = folder / "agent.log"
    with open(log, "ab") as out:
        popen = subprocess.Popen([sys.executable, "-m", "image_preflight", "agent", "--publish", "--node", NODE_NAME,
                                  "--cri-endpoint", stack.node.endpoint, "--kubeconfig", str(kubeconfig), *extra],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield popen
    finally:
        terminate(popen)


def node_images(stack) -> dict | None:
    try:
        return k8s.CustomObjectsApi(stack.core.api_client).get_cluster_custom_object(
            "image-preflight.io", "v1alpha1", "nodeimages", NODE_NAME)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def delete_node_images(stack) -> None:
    k8s.CustomObjectsApi(stack.core.api_client).delete_collection_cluster_custom_object(
        "image-preflight.io", "v1alpha1", "nodeimages")
