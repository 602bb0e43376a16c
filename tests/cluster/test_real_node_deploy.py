"""deploy/ as Pods on the real node (tests/node/deployed.py): the image built from the Dockerfile,
the webhook, watchdog and agent started by the kubelet as the manifests say, reached through their
Service as in a cluster (the apiserver's cluster egress dials the ClusterIP; the host routes the
Service subnet to the node, whose kube-proxy sends it to the Pods' addresses on the bridge).

The replica-loss and upgrade streams run with `failurePolicy: Fail`, so a call that reaches no
replica fails its creation: zero failed creations means every call was answered.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest
import yaml
from kubernetes import client as k8s

from image_preflight.core.watchdog import job_failure
from tests.agent_lightning import TEMPLATE, build_job_spec, example_row
from tests.controlplane.cluster import wait_for
from tests.needs import record_figures
from tests.node.deployed import (
    AGENT_NAMESPACE,
    AdmissionStream,
    DENIED,
    INSTALL,
    NAMESPACE,
    deployed,
    message,
    ready,
    served_serial,
)
from tests.node.images import swe_smith_image
from tests.node.real_node import NODE_NAME
from tests.builders import example_row_id

HELD = swe_smith_image("pandas-dev", "pandas", "95280573e1")
ABSENT = swe_smith_image("getmoto", "moto", "694ce1f4a1")
UID = 10001
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _figures():
    yield
    record_figures(FIGURES)


@pytest.fixture(scope="module")
def held(deployed):  # noqa: F811 - fixture
    deployed.node.import_images([HELD])
    deployed.node.wait_in_status(HELD)
    return deployed


def rollout(image: str) -> dict:
    """The Job agent-lightning's controller renders for a SWE-smith row naming `image`."""
    row = dict(example_row(example_row_id()), image_name=image.removesuffix(":openai"))
    return build_job_spec(TEMPLATE.read_text(), row, rollout_id=uuid.uuid4().hex[:8], namespace=None)


def container_processes(deployment, pod: k8s.V1Pod) -> list[int]:
    """Host PIDs of the Pod's containers' first processes, from containerd's task list."""
    ids = {s.container_id.removeprefix("containerd://") for s in pod.status.container_statuses or ()}
    rows = [row.split() for row in deployment.node.ctr("tasks", "ls").splitlines()[1:]]
    return [int(row[1]) for row in rows if row and row[0] in ids]


def pod_logs(deployment, pod: str) -> str:
    return deployment.core.read_namespaced_pod_log(pod, NAMESPACE, container="webhook")


def doctor(deployment, namespace: str) -> tuple[int, str]:
    """`image-preflight doctor` as a user runs it beside the cluster, reaching the Service."""
    done = subprocess.run([sys.executable, "-m", "image_preflight", "doctor", "--kubeconfig",
                           str(deployment.plane.kubeconfig), "--namespace", namespace,
                           "--webhook-address", deployment.service_address()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, done.stdout


# --- the Pods ----------------------------------------------------------------------------------------


def test_every_pod_runs_the_built_image_ready_as_its_non_root_user_on_a_read_only_root(held):
    pods = (held.core.list_namespaced_pod(NAMESPACE).items
            + held.core.list_namespaced_pod(AGENT_NAMESPACE).items)
    faces = Counter(p.metadata.labels.get("app.kubernetes.io/name") for p in pods if not p.metadata.deletion_timestamp)
    assert faces == {"image-preflight": 2, "image-preflight-watchdog": 2, "image-preflight-agent": 1}, faces
    for pod in pods:
        assert pod.spec.node_name == NODE_NAME and ready(pod), pod.metadata.name
        assert all(s.image == "docker.io/library/image-preflight:0.1.0" for s in pod.status.container_statuses)
        processes = container_processes(held, pod)
        assert processes, pod.metadata.name
        for pid in processes:
            status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
            assert status["Uid"].split()[:2] == [str(UID), str(UID)], (pod.metadata.name, status["Uid"])
            root = next(line for line in open(f"/proc/{pid}/mountinfo").read().splitlines() if line.split()[4] == "/")
            assert "ro" in root.split()[5].split(","), (pod.metadata.name, root)


def test_the_pods_use_their_service_account_tokens_and_are_never_refused(held):
    """Kubernetes' audit log (k8s.io/apiserver/pkg/audit): each face's requests come from its own
    ServiceAccount, through the token the kubelet projected, and none is forbidden."""
    accounts = {"system:serviceaccount:image-preflight:image-preflight",
                "system:serviceaccount:image-preflight:image-preflight-watchdog",
                "system:serviceaccount:image-preflight-agent:image-preflight-agent"}

    def from_pods() -> list[dict]:
        """Requests made with a token bound to a Pod: the one the kubelet projected."""
        events = [json.loads(line) for line in held.plane.audit_log.read_text().splitlines() if line.strip()]
        return [e for e in events if "authentication.kubernetes.io/pod-name" in (e["user"].get("extra") or {})]

    # A Ready Pod has not necessarily asked anything yet (the agent lists the runtime first).
    wait_for(lambda: {e["user"]["username"] for e in from_pods()} >= accounts, "each face's first request",
             timeout_s=60, interval_s=1)
    events = from_pods()
    assert {e["user"]["username"] for e in events} == accounts
    refused = [(e["user"]["username"], e["verb"], e["requestURI"]) for e in events
               if e.get("responseStatus", {}).get("code") == 403]
    assert not refused, refused


# --- through the Service ------------------------------------------------------------------------------


def test_a_rollout_job_is_denied_and_a_held_one_admitted_by_the_pods_through_the_service(held):
    namespace = held.namespace()
    batch = k8s.BatchV1Api(held.plane.api_client())
    before = len(held.plane.network.dialed)
    with pytest.raises(k8s.ApiException) as denied:
        batch.create_namespaced_job(namespace, rollout(ABSENT), dry_run="All")
    assert denied.value.status == 422 and DENIED in message(denied.value)
    batch.create_namespaced_job(namespace, rollout(HELD), dry_run="All")
    # The apiserver dialed the Service's ClusterIP; a replica's own log holds the verdict.
    assert held.service_address() in held.plane.network.dialed[before:]
    wait_for(lambda: any(ABSENT.split(":")[0] in pod_logs(held, p.metadata.name) for p in held.webhook_pods()),
             "a replica logged the denial", timeout_s=30, interval_s=1)


def test_the_agent_pod_publishes_the_nodes_images(held):
    custom = k8s.CustomObjectsApi(held.plane.api_client())

    def published() -> set[str]:
        try:
            found = custom.get_cluster_custom_object("image-preflight.io", "v1alpha1", "nodeimages", NODE_NAME)
        except k8s.ApiException:
            return set()
        return {tag for image in found["spec"]["images"] for tag in image.get("repoTags") or ()}

    wait_for(lambda: {HELD, "docker.io/library/image-preflight:0.1.0"} <= published(),
             "the agent's NodeImages lists the node's images", timeout_s=90, interval_s=1)
    fresh = swe_smith_image("imported", "now", uuid.uuid4().hex[:10])
    start = time.monotonic()
    held.node.import_images([fresh])
    wait_for(lambda: fresh in published(), "the import published", timeout_s=30, interval_s=0.1)
    FIGURES["agent_pod_import_to_published_s"] = round(time.monotonic() - start, 2)


def test_the_watchdog_pods_fail_a_job_whose_image_went_after_admission(held):
    namespace = held.namespace()
    image = swe_smith_image("collected", "later", uuid.uuid4().hex[:10])
    held.node.import_images([image])
    held.node.wait_in_status(image)
    job = rollout(image)
    job["spec"].update({"completions": 2, "parallelism": 1})
    batch = k8s.BatchV1Api(held.plane.api_client())
    name = batch.create_namespaced_job(namespace, job).metadata.name
    wait_for(lambda: any(p.status.phase in ("Running", "Succeeded") for p in
                         held.core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items),
             "the first Pod started", timeout_s=90)
    held.node.remove_images(image)

    def failed():
        found = batch.read_namespaced_job(name, namespace)
        return any(c.type == "Failed" and c.status == "True" for c in found.status.conditions or ()) and found

    found = wait_for(failed, f"{name} Failed", timeout_s=120, interval_s=0.5)
    recorded = json.loads(found.metadata.annotations[job_failure.ANNOTATION])
    assert recorded["action"] == "failed", recorded


# --- availability -------------------------------------------------------------------------------------


def stream(held, threads: int = 2) -> AdmissionStream:
    return AdmissionStream(held, held.namespace(), rollout(HELD), rollout(ABSENT), threads=threads)


def test_a_replica_deleted_under_a_stream_of_creations_fails_none_and_admits_none_unchecked(held):
    admission = k8s.AdmissionregistrationV1Api(held.plane.api_client())
    assert admission.read_validating_webhook_configuration("image-preflight").webhooks[0].failure_policy == "Fail"
    victim = held.webhook_pods()[0].metadata.name
    with stream(held) as creations:
        creations.wait_count(20)
        held.core.delete_namespaced_pod(victim, NAMESPACE)
        wait_for(lambda: victim not in {p.metadata.name for p in held.core.list_namespaced_pod(NAMESPACE).items},
                 f"{victim} gone", timeout_s=90, interval_s=0.5)
        held.wait_rolled_out()
        count = creations.total
        creations.wait_count(count + 20)
    FIGURES["replica_loss_creations"] = creations.total
    assert not creations.failed, creations.failed[:5]
    assert not creations.unchecked, creations.unchecked[:5]
    assert creations.admitted > 20 and creations.denied > 20


def test_an_upgrade_to_a_new_tag_rolls_both_replicas_without_a_failed_admission(held):
    held.node.ctr("images", "tag", "docker.io/library/image-preflight:0.1.0", "docker.io/library/image-preflight:0.1.1")
    overlay = held.workspace / "my-cluster" / "kustomization.yaml"
    original = overlay.read_text()
    upgraded = yaml.safe_load(original)
    upgraded["images"] = [{"name": "image-preflight", "newTag": "0.1.1"}]
    overlay.write_text(yaml.safe_dump(upgraded, sort_keys=False))
    before = {p.metadata.name for p in held.webhook_pods()}
    try:
        with stream(held) as creations:
            creations.wait_count(20)
            start = time.monotonic()
            held.apply()
            held.wait_rolled_out()
            wait_for(lambda: not before & {p.metadata.name for p in held.core.list_namespaced_pod(NAMESPACE).items},
                     "the old replicas gone", timeout_s=120, interval_s=0.5)
            FIGURES["upgrade_rollout_s"] = round(time.monotonic() - start, 1)
            count = creations.total
            creations.wait_count(count + 20)
        assert not creations.failed, creations.failed[:5]
        assert not creations.unchecked, creations.unchecked[:5]
        pods = held.webhook_pods()
        assert {p.spec.containers[0].image for p in pods} == {"image-preflight:0.1.1"}
        FIGURES["upgrade_creations"] = creations.total
    finally:
        overlay.write_text(original)
        held.apply()  # back to 0.1.0, the tag the later tests load again
        held.wait_rolled_out()


# --- certificates and doctor --------------------------------------------------------------------------


def test_a_certificate_rotated_in_the_secret_is_served_without_a_restart(held):
    pods = held.webhook_pods()
    restarts = {p.metadata.name: sum(s.restart_count for s in p.status.container_statuses) for p in pods}
    addresses = [f"{p.status.pod_ip}:8443" for p in pods]
    old = {served_serial(a) for a in addresses}
    assert len(old) == 1
    # docs/deploy.md, "Renewal": the same two commands; renewing 365 days before expiry forces it.
    held.run("image-preflight certs --service image-preflight --namespace image-preflight"
             " --out-dir image-preflight/deploy/overlays/self-signed/certs --days 400 --renew-before 365")
    start = time.monotonic()
    held.apply()
    wait_for(lambda: all(served_serial(a) not in old for a in addresses), "both replicas serve the new certificate",
             timeout_s=180, interval_s=1)
    FIGURES["secret_applied_to_served_s"] = round(time.monotonic() - start, 1)
    after = {p.metadata.name: sum(s.restart_count for s in p.status.container_statuses) for p in held.webhook_pods()}
    assert after == restarts
    with pytest.raises(k8s.ApiException) as denied:
        k8s.BatchV1Api(held.plane.api_client()).create_namespaced_job(held.namespace(), rollout(ABSENT), dry_run="All")
    assert DENIED in message(denied.value)  # the apiserver trusts the new certificate: same CA


def test_doctor_says_the_deployment_is_healthy(held):
    code, out = doctor(held, held.namespace())
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    # The one problem is the test's own choice of failurePolicy Fail, which doctor advises against.
    assert code == 1 and len(problems) == 1 and "has failurePolicy Fail" in problems[0], out
    assert re.search(r"2 ready webhook endpoint\(s\)", out), out
    assert f"the caBundle verifies the certificate served at {held.service_address()}" in out, out


def test_doctor_names_a_replica_that_cannot_start_and_a_stale_ca_bundle(held):
    namespace = held.namespace()
    image = "docker.io/library/image-preflight:0.1.0"
    victim = held.webhook_pods()[0].metadata.name
    held.node.remove_images(image, "docker.io/library/image-preflight:0.1.1")
    try:
        held.core.delete_namespaced_pod(victim, NAMESPACE)
        wait_for(lambda: len(held.webhook_pods()) == 2 and not all(ready(p) for p in held.webhook_pods()),
                 "a replacement replica that cannot start", timeout_s=60, interval_s=0.5)
        wait_for(lambda: "1 of 2 replicas ready" in doctor(held, namespace)[1], "doctor names the replica",
                 timeout_s=60, interval_s=2)
        code, out = doctor(held, namespace)
        assert code == 1 and "image-preflight:0.1.0" in out, out
    finally:
        held.run("ctr -n k8s.io images import image-preflight.tar")
    for pod in held.webhook_pods():
        if not ready(pod):
            held.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)
    held.wait_rolled_out()

    admission = k8s.AdmissionregistrationV1Api(held.plane.api_client())
    config = admission.read_validating_webhook_configuration("image-preflight")
    current = config.webhooks[0].client_config.ca_bundle
    other = held.workspace / "other-ca"
    held.run(f"image-preflight certs --service image-preflight --namespace image-preflight --out-dir {other}")
    stale = base64.b64encode((other / "ca.crt").read_bytes()).decode()
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": stale}]
    admission.patch_validating_webhook_configuration("image-preflight", patch)
    try:
        code, out = doctor(held, namespace)
        assert code == 1 and "does not verify the certificate the webhook" in out, out
    finally:
        admission.patch_validating_webhook_configuration(
            "image-preflight", [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": current}])


def test_docs_deploy_shows_every_install_command_the_test_runs():
    from pathlib import Path
    docs = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    blocks = "\n".join(re.findall(r"```sh\n(.*?)```", docs, flags=re.S))
    missing = [command for command in INSTALL if command not in blocks]
    assert not missing, missing
