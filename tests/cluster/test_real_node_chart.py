"""The chart on the real node, installed by docs/quickstart.md run as printed (tests/node/installed.py):
the image built from the Dockerfile, `helm install` with the chart's defaults, every Pod started by
the kubelet and reached through its Service as in a cluster (the apiserver's cluster egress dials
the ClusterIP; the host routes the Service subnet to the node, whose kube-proxy sends it to the
Pods' addresses on the bridge); then `helm test`, upgrades under a stream of creations, the
agents kept to their own node, and `helm uninstall`.

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
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from image_preflight.core.watchdog import job_failure
from tests.agent_lightning import TEMPLATE, build_job_spec, example_row
from tests.builders.rows import example_row_id
from tests.chart import AGENT_NAMESPACE, NAMESPACE
from tests.controlplane.cluster import kubeconfig_document, wait_for, write_kubeconfig
from tests.needs import record_figures
from tests.node import quickstart
from tests.node.images import swe_smith_image
from tests.node.installed import (
    DENIED,
    GPU_NODE,
    ROLLOUTS,
    AdmissionStream,
    held_images,
    installing,
    message,
    ready,
    served_serial,
)
from tests.node.real_node import NODE_NAME
from tests.release import IMAGE, ROOT, VERSION

HELD = swe_smith_image("pandas-dev", "pandas", "95280573e1")
ABSENT = swe_smith_image("getmoto", "moto", "694ce1f4a1")
UID = 10001
FIGURES: dict[str, float] = {}
NODEIMAGES = ("image-preflight.io", "v1alpha1", "nodeimages")
AGENT_DOC = Path(__file__).resolve().parents[2] / "docs" / "agent.md"


@pytest.fixture(scope="module", autouse=True)
def _figures():
    yield
    record_figures(FIGURES)


@pytest.fixture(scope="module")
def installed(real_node, preflight_image, tmp_path_factory):
    """docs/quickstart.md run on the real node once for this module (tests.node.installed.installing)."""
    with installing(real_node, preflight_image, tmp_path_factory.mktemp("installed")) as installation:
        yield installation


def rollout(image: str) -> dict:
    """The Job agent-lightning's controller renders for a SWE-smith row naming `image`."""
    row = dict(example_row(example_row_id()), image_name=image.removesuffix(":openai"))
    return build_job_spec(TEMPLATE.read_text(), row, rollout_id=uuid.uuid4().hex[:8], namespace=None)


def container_processes(installation, pod: k8s.V1Pod) -> list[int]:
    """Host PIDs of the Pod's containers' first processes, from containerd's task list."""
    ids = {s.container_id.removeprefix("containerd://") for s in pod.status.container_statuses or ()}
    rows = [row.split() for row in installation.node.ctr("tasks", "ls").splitlines()[1:]]
    return [int(row[1]) for row in rows if row and row[0] in ids]


def pod_logs(installation, pod: str) -> str:
    return installation.core.read_namespaced_pod_log(pod, NAMESPACE, container="webhook")


def doctor(installation, namespace: str) -> tuple[int, str]:
    """`image-preflight doctor` as a user runs it beside the cluster, reaching the Service."""
    done = subprocess.run([sys.executable, "-m", "image_preflight", "doctor", "--kubeconfig",
                           str(installation.plane.kubeconfig), "--namespace", namespace,
                           "--webhook-address", installation.service_address()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, done.stdout


def published(installation, node: str = NODE_NAME) -> dict | None:
    try:
        return k8s.CustomObjectsApi(installation.plane.api_client()).get_cluster_custom_object(*NODEIMAGES, node)
    except k8s.ApiException:
        return None


# --- the page, as printed ---------------------------------------------------------------------------


def test_the_quickstart_installs_checks_filters_and_pins(installed):
    """What the page's commands printed: helm test passed, the scan kept the rows whose images the
    node holds and dropped the others, and the agent pins what the kept rows need."""
    text = "\n".join(installed.outputs)
    # The chart's NOTES name the next commands.
    assert "helm test image-preflight -n image-preflight" in text and "kubectl label namespace" in text, text
    assert re.search(r"TEST SUITE:\s+image-preflight-test\s+.*Phase:\s+Succeeded", text, re.S), text
    report = json.loads((installed.clone / "dropped.json").read_text())
    held = {name.removeprefix("docker.io/") for name in held_images()}
    for split in ("train_dataset_mixed.jsonl", "val_dataset_filtered.jsonl"):
        kept = [json.loads(line) for line in (installed.clone / "filtered" / split).read_text().splitlines()]
        assert kept and all(row["image_name"] + ":openai" in held for row in kept), split
    # Dropped: the rows naming an image the node lacks, and val's row without image_name.
    reasons = {(d["reason"], image in held) for d in report["dropped"] for image in d["images"] or [""]}
    assert reasons == {("missing", False), ("unrenderable", False)}, report["dropped"]
    needed = set((installed.clone / "needed.txt").read_text().split())
    assert needed and needed <= set(held_images())
    # The stand-in for agent-lightning's run.sh was started on the filtered files.
    started = (installed.home / "run.sh.started").read_text().split()
    assert started == ["trainer", str(installed.clone / "filtered" / "train_dataset_mixed.jsonl"),
                       str(installed.clone / "filtered" / "val_dataset_filtered.jsonl")]


def test_what_the_controller_submits_of_the_filtered_rows_is_admitted_and_of_the_dropped_rows_denied(installed):
    """The Jobs agent-lightning's own build_job_spec renders for every row the trainer was started
    with are admitted; every row the scan dropped is denied with the word that fails its rollout."""
    batch = k8s.BatchV1Api(installed.plane.api_client())
    kept = [json.loads(line) for split in ("train_dataset_mixed.jsonl", "val_dataset_filtered.jsonl")
            for line in (installed.clone / "filtered" / split).read_text().splitlines()]
    template = TEMPLATE.read_text()
    for row in kept:
        job = build_job_spec(template, row, rollout_id=uuid.uuid4().hex[:8], namespace=None)
        batch.create_namespaced_job(ROLLOUTS, job, dry_run="All")
    report = json.loads((installed.clone / "dropped.json").read_text())
    sources = {p.name: [json.loads(line) for line in p.read_text().splitlines()]
               for p in (installed.home / quickstart.AGL_EXAMPLE).glob("*.jsonl")}
    for dropped in report["dropped"]:
        row = sources[dropped["file"].rpartition("/")[2]][dropped["row"]]
        with pytest.raises(k8s.ApiException) as refused:
            batch.create_namespaced_job(ROLLOUTS, build_job_spec(template, row, rollout_id=uuid.uuid4().hex[:8],
                                                                 namespace=None), dry_run="All")
        assert refused.value.status == 422 and DENIED in message(refused.value)


def test_a_held_image_rollout_runs_to_completion(installed):
    namespace = installed.namespace()
    batch = k8s.BatchV1Api(installed.plane.api_client())
    name = batch.create_namespaced_job(namespace, rollout(HELD)).metadata.name

    def complete():
        found = batch.read_namespaced_job(name, namespace)
        return any(c.type == "Complete" and c.status == "True" for c in found.status.conditions or ())

    wait_for(complete, f"{name} Complete", timeout_s=120, interval_s=0.5)


# --- the Pods ----------------------------------------------------------------------------------------


def test_every_pod_runs_the_built_image_ready_as_its_non_root_user_on_a_read_only_root(installed):
    pods = [p for p in installed.core.list_namespaced_pod(NAMESPACE).items
            + installed.core.list_namespaced_pod(AGENT_NAMESPACE).items
            if not p.metadata.deletion_timestamp and p.metadata.labels.get("app.kubernetes.io/component") != "test"]
    faces = Counter(p.metadata.labels.get("app.kubernetes.io/name") for p in pods)
    assert faces == {"image-preflight": 2, "image-preflight-watchdog": 2, "image-preflight-agent": 1}, faces
    for pod in pods:
        assert pod.spec.node_name == NODE_NAME and ready(pod), pod.metadata.name
        # Pulled from the page's registry: the runtime reports it by that repository's digest.
        assert all(s.image == installed.image for s in pod.status.container_statuses), pod.metadata.name
        repository = installed.image.rpartition(":")[0]
        assert all(s.image_id.startswith(f"{repository}@sha256:") for s in pod.status.container_statuses)
        processes = container_processes(installed, pod)
        assert processes, pod.metadata.name
        for pid in processes:
            status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
            assert status["Uid"].split()[:2] == [str(UID), str(UID)], (pod.metadata.name, status["Uid"])
            root = next(line for line in open(f"/proc/{pid}/mountinfo").read().splitlines() if line.split()[4] == "/")
            assert "ro" in root.split()[5].split(","), (pod.metadata.name, root)


def test_the_pods_use_their_service_account_tokens_and_are_never_refused(installed):
    """Kubernetes' audit log (k8s.io/apiserver/pkg/audit): each face's requests come from its own
    ServiceAccount, through the token the kubelet projected, and none is forbidden."""
    accounts = {"system:serviceaccount:image-preflight:image-preflight",
                "system:serviceaccount:image-preflight:image-preflight-watchdog",
                "system:serviceaccount:image-preflight:image-preflight-test",
                "system:serviceaccount:image-preflight-agent:image-preflight-agent"}

    def from_pods() -> list[dict]:
        """Requests made with a token bound to a Pod: the one the kubelet projected."""
        events = [json.loads(line) for line in installed.plane.audit_log.read_text().splitlines() if line.strip()]
        return [e for e in events if "authentication.kubernetes.io/pod-name" in (e["user"].get("extra") or {})]

    # A Ready Pod has not necessarily asked anything yet (the agent lists the runtime first).
    wait_for(lambda: {e["user"]["username"] for e in from_pods()} >= accounts, "each face's first request",
             timeout_s=60, interval_s=1)
    events = from_pods()
    assert {e["user"]["username"] for e in events} == accounts
    refused = [(e["user"]["username"], e["verb"], e["requestURI"]) for e in events
               if e.get("responseStatus", {}).get("code") == 403]
    # helm test's doctor asks each kubelet's configz and is refused: the chart grants it no
    # nodes/proxy (the whole kubelet API), and doctor reports that read as skipped.
    expected = [r for r in refused if r[0].endswith(":image-preflight-test") and "/proxy/configz" in r[2]]
    assert refused == expected and len(expected) <= 2, refused


# --- through the Service ------------------------------------------------------------------------------


def test_a_rollout_job_is_denied_and_a_held_one_admitted_by_the_pods_through_the_service(installed):
    namespace = installed.namespace()
    batch = k8s.BatchV1Api(installed.plane.api_client())
    with pytest.raises(k8s.ApiException) as denied:
        batch.create_namespaced_job(namespace, rollout(ABSENT), dry_run="All")
    assert denied.value.status == 422 and DENIED in message(denied.value)
    batch.create_namespaced_job(namespace, rollout(HELD), dry_run="All")
    # The apiserver dialed the Service's ClusterIP (once, keeping the connection); a replica's own
    # log holds the verdict.
    assert installed.service_address() in installed.plane.network.dialed
    wait_for(lambda: any(ABSENT.split(":")[0] in pod_logs(installed, p.metadata.name)
                         for p in installed.webhook_pods()),
             "a replica logged the denial", timeout_s=30, interval_s=1)


def test_the_agent_pod_publishes_the_nodes_images_and_pins_the_needed_ones(installed):
    def names() -> set[str]:
        found = published(installed) or {"spec": {"images": []}}
        return {tag for image in found["spec"]["images"] for tag in image.get("repoTags") or ()}

    wait_for(lambda: {HELD, installed.image} <= names(),
             "the agent's NodeImages lists the node's images", timeout_s=90, interval_s=1)
    needed = set((installed.clone / "needed.txt").read_text().split())
    wait_for(lambda: (published(installed)["spec"].get("pinning") or {}).get("pinned") == len(needed),
             "the needed images pinned", timeout_s=60, interval_s=1)
    pinning = published(installed)["spec"]["pinning"]
    assert pinning == {"list": f"{AGENT_NAMESPACE}/needed-images", "supported": True, "needed": len(needed),
                       "pinned": len(needed)}
    fresh = swe_smith_image("imported", "now", uuid.uuid4().hex[:10])
    start = time.monotonic()
    installed.node.import_images([fresh])
    wait_for(lambda: fresh in names(), "the import published", timeout_s=30, interval_s=0.1)
    FIGURES["agent_pod_import_to_published_s"] = round(time.monotonic() - start, 2)


# --- each agent writes its own node's list only ------------------------------------------------------


def _agent_token(installed, *, bound: bool) -> k8s.ApiClient:
    """A token of the agent's ServiceAccount: bound to its Pod on the real node, or to nothing."""
    (pod,) = installed.core.list_namespaced_pod(
        AGENT_NAMESPACE, label_selector="app.kubernetes.io/name=image-preflight-agent").items
    spec = k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600, bound_object_ref=k8s.V1BoundObjectReference(
        api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid) if bound else None)
    token = installed.core.create_namespaced_service_account_token(
        "image-preflight-agent", AGENT_NAMESPACE, k8s.AuthenticationV1TokenRequest(spec=spec)).status.token
    path = installed.home / f"agent-{'bound' if bound else 'unbound'}.kubeconfig"
    plane = installed.plane
    return plane.api_client(write_kubeconfig(path, kubeconfig_document(plane.url, plane.ca.cert_path,
                                                                       {"token": token})))


def _node_images(name: str) -> dict:
    return {"apiVersion": "image-preflight.io/v1alpha1", "kind": "NodeImages", "metadata": {"name": name},
            "spec": {"nodeName": name, "observedAt": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 300,
                     "images": []}}


def test_an_agent_token_bound_to_one_node_cannot_write_another_nodes_list(installed):
    """The chart's ValidatingAdmissionPolicy on the real apiserver: the agent Pod's own token writes
    its node's NodeImages (it published above), but may not create, update or delete another
    node's; a token of the same account bound to no Pod may write none."""
    custom = k8s.CustomObjectsApi(_agent_token(installed, bound=True))
    current = custom.get_cluster_custom_object(*NODEIMAGES, NODE_NAME)
    custom.replace_cluster_custom_object(*NODEIMAGES, NODE_NAME, current)  # its own: allowed
    with pytest.raises(k8s.ApiException) as refused:
        custom.create_cluster_custom_object(*NODEIMAGES, _node_images(GPU_NODE))
    assert refused.value.status == 403
    # As docs/agent.md shows it, for its node cpu-node-1.
    (shown,) = [" ".join(b.split()) for b in re.findall(r"```text\n(.*?)```", AGENT_DOC.read_text(), re.S)
                if "may write only NodeImages" in b]
    assert message(refused.value) == shown.replace("cpu-node-1", NODE_NAME)
    admin = k8s.CustomObjectsApi(installed.plane.api_client())
    other = admin.create_cluster_custom_object(*NODEIMAGES, _node_images(GPU_NODE))
    try:
        with pytest.raises(k8s.ApiException) as refused:
            custom.replace_cluster_custom_object(*NODEIMAGES, GPU_NODE,
                                                 {**other, "spec": {**other["spec"], "images": []}})
        assert refused.value.status == 403 and "may write only NodeImages" in message(refused.value)
        # A patch or a delete is refused by RBAC before admission: the agent's role grants neither.
        with pytest.raises(k8s.ApiException) as refused:
            custom.patch_cluster_custom_object(*NODEIMAGES, GPU_NODE, {"spec": {"images": []}})
        assert refused.value.status == 403 and 'cannot patch resource "nodeimages"' in message(refused.value)
        with pytest.raises(k8s.ApiException) as refused:
            custom.delete_cluster_custom_object(*NODEIMAGES, GPU_NODE)
        assert refused.value.status == 403 and 'cannot delete resource "nodeimages"' in message(refused.value)
    finally:
        admin.delete_cluster_custom_object(*NODEIMAGES, GPU_NODE)
    unbound = k8s.CustomObjectsApi(_agent_token(installed, bound=False))
    with pytest.raises(k8s.ApiException) as refused:
        unbound.replace_cluster_custom_object(*NODEIMAGES, NODE_NAME, current)
    assert refused.value.status == 403
    assert message(refused.value).endswith("may write NodeImages only with a token bound to a Pod on a node")


# --- helm test, the watchdog --------------------------------------------------------------------------


def test_helm_test_passes_and_its_pod_tells_every_finding(installed):
    out = installed.helm("test", "image-preflight")
    assert re.search(r"Phase:\s+Succeeded", out), out
    logs = installed.core.read_namespaced_pod_log("image-preflight-test", NAMESPACE)
    assert "ok: the apiserver calls the webhook: a dry-run Job in image-preflight-test was denied" in logs, logs
    assert f"ok: node {NODE_NAME}: complete list from the node agent" in logs, logs
    assert GPU_NODE not in logs.replace(f"node(s): {NODE_NAME}", "")  # tainted: not where rollouts land
    assert logs.rstrip().endswith("no problems found"), logs


def test_the_watchdog_pods_fail_a_job_whose_image_went_after_admission(installed):
    namespace = installed.namespace()
    image = swe_smith_image("collected", "later", uuid.uuid4().hex[:10])
    installed.node.import_images([image])
    installed.node.wait_in_status(image)
    job = rollout(image)
    job["spec"].update({"completions": 2, "parallelism": 1})
    batch = k8s.BatchV1Api(installed.plane.api_client())
    name = batch.create_namespaced_job(namespace, job).metadata.name
    wait_for(lambda: any(p.status.phase in ("Running", "Succeeded") for p in
                         installed.core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items),
             "the first Pod started", timeout_s=90)
    installed.node.remove_images(image)

    def failed():
        found = batch.read_namespaced_job(name, namespace)
        return any(c.type == "Failed" and c.status == "True" for c in found.status.conditions or ()) and found

    found = wait_for(failed, f"{name} Failed", timeout_s=120, interval_s=0.5)
    recorded = json.loads(found.metadata.annotations[job_failure.ANNOTATION])
    assert recorded["action"] == "failed", recorded


# --- availability, upgrades ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def failing_closed(installed):
    """failurePolicy Fail from here on: a call that reaches no replica fails its creation."""
    installed.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--reuse-values",
                   "--set", "webhook.failurePolicy=Fail", "--wait")
    admission = k8s.AdmissionregistrationV1Api(installed.plane.api_client())
    assert admission.read_validating_webhook_configuration("image-preflight").webhooks[0].failure_policy == "Fail"
    installed.wait_rolled_out()
    return installed


def stream(installation, threads: int = 2) -> AdmissionStream:
    return AdmissionStream(installation, installation.namespace(), rollout(HELD), rollout(ABSENT), threads=threads)


def test_a_replica_deleted_under_a_stream_of_creations_fails_none_and_admits_none_unchecked(failing_closed):
    held = failing_closed
    victim = held.webhook_pods()[0].metadata.name
    with stream(held) as creations:
        creations.wait_count(20)
        held.core.delete_namespaced_pod(victim, NAMESPACE)
        wait_for(lambda: victim not in {p.metadata.name for p in held.core.list_namespaced_pod(NAMESPACE).items},
                 f"{victim} gone", timeout_s=90, interval_s=0.5)
        held.wait_rolled_out()
        creations.wait_more()
    FIGURES["replica_loss_creations"] = creations.total
    creations.assert_every_answer_right()


def _secret(installation, name: str) -> dict:
    return installation.core.read_namespaced_secret(name, NAMESPACE).data


def test_helm_upgrade_to_a_new_tag_under_a_stream_fails_no_creation_and_keeps_the_certificates(failing_closed):
    held = failing_closed
    held.node.ctr("images", "tag", held.image, f"{held.image}-next")
    before = {p.metadata.name for p in held.webhook_pods()}
    certificates = (_secret(held, "image-preflight-ca"), _secret(held, "image-preflight-tls"))
    try:
        with stream(held) as creations:
            creations.wait_count(20)
            start = time.monotonic()
            held.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--reuse-values",
                      "--set", f"image.tag={VERSION}-next", "--wait")
            held.wait_rolled_out()
            wait_for(lambda: not before & {p.metadata.name for p in held.core.list_namespaced_pod(NAMESPACE).items},
                     "the old replicas gone", timeout_s=120, interval_s=0.5)
            FIGURES["upgrade_rollout_s"] = round(time.monotonic() - start, 1)
            creations.wait_more()
        creations.assert_every_answer_right(at_least=10)
        assert {p.spec.containers[0].image for p in held.webhook_pods()} == {f"{held.image}-next"}
        FIGURES["upgrade_creations"] = creations.total
        # No new CA and no new certificate on an upgrade: lookup read them back.
        assert (_secret(held, "image-preflight-ca"), _secret(held, "image-preflight-tls")) == certificates
    finally:
        held.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--reuse-values",
                  "--set", f"image.tag={VERSION}", "--wait")  # the tag the later tests load again
        held.wait_rolled_out()


def test_the_agents_switched_to_hashed_lists_under_a_stream_wrongly_admit_and_deny_nothing(failing_closed):
    """The upgrade docs/agent.md gives ("The published form"): the readers first, then the agents
    to agent.listForm hashes, while Jobs stream in. With --max-images 1 the node's status proves
    nothing (it lists more), so only the agent's list, in either form, denies the absent image: a
    reader that lost it would admit that image unchecked."""
    held = failing_closed
    agents = "app.kubernetes.io/name=image-preflight-agent"
    held.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--reuse-values",
              "--set", "webhook.maxImages=1", "--wait")
    try:
        held.wait_rolled_out()
        before = {p.metadata.name for p in held.core.list_namespaced_pod(AGENT_NAMESPACE, label_selector=agents).items}
        with stream(held) as creations:
            creations.wait_count(20)
            held.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--reuse-values",
                      "--set", "agent.listForm=hashes", "--wait")
            wait_for(lambda: "imageHashes" in (published(held) or {}).get("spec", {}),
                     "the new agent publishes the hashed list", timeout_s=120, interval_s=0.5)
            after = {p.metadata.name
                     for p in held.core.list_namespaced_pod(AGENT_NAMESPACE, label_selector=agents).items}
            assert after and not before & after  # the DaemonSet rolled its Pod
            creations.wait_more()
        creations.assert_every_answer_right()
        FIGURES["list_form_switch_creations"] = creations.total
    finally:
        held.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--reuse-values",
                  "--set", "agent.listForm=images", "--set", "webhook.maxImages=50", "--wait")
        held.wait_rolled_out()
        wait_for(lambda: "images" in (published(held) or {}).get("spec", {}),
                 "the agent lists the images again", timeout_s=120, interval_s=0.5)


def test_an_upgrade_within_renew_before_days_issues_a_new_certificate_served_without_a_restart(failing_closed):
    held = failing_closed
    pods = held.webhook_pods()
    restarts = {p.metadata.name: sum(s.restart_count for s in p.status.container_statuses) for p in pods}
    addresses = [f"{p.status.pod_ip}:8443" for p in pods]
    old = {served_serial(a) for a in addresses}
    assert len(old) == 1
    ca = _secret(held, "image-preflight-ca")
    # 400 days before a one-year certificate's end is now: the next upgrade renews it.
    held.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--reuse-values",
              "--set", "certificates.generate.renewBeforeDays=400")
    start = time.monotonic()
    try:
        wait_for(lambda: all(served_serial(a) not in old for a in addresses), "both replicas serve the new certificate",
                 timeout_s=180, interval_s=1)
        FIGURES["secret_applied_to_served_s"] = round(time.monotonic() - start, 1)
    finally:
        held.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--reuse-values",
                  "--set", "certificates.generate.renewBeforeDays=30")
    after = {p.metadata.name: sum(s.restart_count for s in p.status.container_statuses) for p in held.webhook_pods()}
    assert after == restarts
    assert _secret(held, "image-preflight-ca") == ca  # the same CA signs it: the caBundle stands
    with pytest.raises(k8s.ApiException) as denied:
        k8s.BatchV1Api(held.plane.api_client()).create_namespaced_job(held.namespace(), rollout(ABSENT), dry_run="All")
    assert DENIED in message(denied.value)


# --- doctor -------------------------------------------------------------------------------------------


def test_doctor_says_the_deployment_is_healthy(failing_closed):
    held = failing_closed
    code, out = doctor(held, ROLLOUTS)
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    # The one problem is the test's own choice of failurePolicy Fail, which doctor advises against.
    assert code == 1 and len(problems) == 1 and "has failurePolicy Fail" in problems[0], out
    assert re.search(r"2 ready webhook endpoint\(s\)", out), out
    assert f"the caBundle verifies the certificate served at {held.service_address()}" in out, out


def test_doctor_names_a_replica_that_cannot_start_and_a_stale_ca_bundle(failing_closed):
    held = failing_closed
    namespace = held.namespace()
    victim = held.webhook_pods()[0].metadata.name
    # Gone from the node, and its registry down: nothing to pull it from.
    held.node.remove_images(held.image, f"{held.image}-next")
    held.registry.stop()
    try:
        held.core.delete_namespaced_pod(victim, NAMESPACE)
        wait_for(lambda: len(held.webhook_pods()) == 2 and not all(ready(p) for p in held.webhook_pods()),
                 "a replacement replica that cannot start", timeout_s=60, interval_s=0.5)
        wait_for(lambda: "1 of 2 replicas ready" in doctor(held, namespace)[1], "doctor names the replica",
                 timeout_s=60, interval_s=2)
        code, out = doctor(held, namespace)
        assert code == 1 and IMAGE in out, out
    finally:
        held.registry.start()
    for pod in held.webhook_pods():
        if not ready(pod):
            held.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)
    held.wait_rolled_out()

    admission = k8s.AdmissionregistrationV1Api(held.plane.api_client())
    config = admission.read_validating_webhook_configuration("image-preflight")
    current = config.webhooks[0].client_config.ca_bundle
    other = held.home / "other-ca"
    held.sh(f"image-preflight certs --service image-preflight --namespace image-preflight --out-dir {other}")
    stale = base64.b64encode((other / "ca.crt").read_bytes()).decode()
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": stale}]
    admission.patch_validating_webhook_configuration("image-preflight", patch)
    try:
        code, out = doctor(held, namespace)
        assert code == 1 and "does not verify the certificate the webhook" in out, out
    finally:
        admission.patch_validating_webhook_configuration(
            "image-preflight", [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": current}])


# --- helm uninstall: last ------------------------------------------------------------------------------


def test_helm_uninstall_leaves_nothing_that_blocks_and_job_creation_works_right_after(failing_closed):
    """The page's last block, as printed. With failurePolicy Fail a webhook configuration left
    behind would refuse every Job in the opted-in namespace; a NodeImages object left behind would
    make every image it does not name unknown once its lease ended."""
    held = failing_closed
    assert published(held) is not None
    (remove,) = [b for b in quickstart.blocks() if b.section == "Remove it"]
    start = time.monotonic()
    held.terminal.block(remove)
    FIGURES["helm_uninstall_s"] = round(time.monotonic() - start, 1)
    admission = k8s.AdmissionregistrationV1Api(held.plane.api_client())
    assert [c.metadata.name for c in admission.list_validating_webhook_configuration().items
            if c.metadata.name.startswith("image-preflight")] == []
    assert [c.metadata.name for c in admission.list_mutating_webhook_configuration().items
            if c.metadata.name.startswith("image-preflight")] == []
    assert [p.metadata.name for p in admission.list_validating_admission_policy().items
            if p.metadata.name.startswith("image-preflight")] == []
    assert k8s.CustomObjectsApi(held.plane.api_client()).list_cluster_custom_object(*NODEIMAGES)["items"] == []
    # Right after: a Job naming an image no node holds is created in the still opted-in namespace.
    job = rollout(ABSENT)
    created = k8s.BatchV1Api(held.plane.api_client()).create_namespaced_job(ROLLOUTS, job, dry_run="All")
    assert created.metadata.name == job["metadata"]["name"]
    assert yaml.safe_load(held.sh("helm list --all-namespaces -o yaml")) == []


# --- from the previous release: after the uninstall ----------------------------------------------------

# The chart as 0.1.0 released it: its NodeImages CRD in crds/, which Helm installs once and never
# upgrades, without the bounds added since (the lease's hour, name lengths, maxItems).
PREVIOUS_RELEASE = "d3ff8fa46b50de96f2d3167df2aa6776121185c9"
PREVIOUS_VERSION = "0.1.0"


def _list_leased_for(seconds: int) -> dict:
    """A list of a node of its own (the agent's is there), written by the admin."""
    return {"apiVersion": "image-preflight.io/v1alpha1", "kind": "NodeImages", "metadata": {"name": "upgrade-probe"},
            "spec": {"nodeName": "upgrade-probe", "observedAt": "2026-12-06T00:00:00Z", "leaseDurationSeconds": seconds,
                     "images": []}}


def _admits(installation, obj: dict) -> bool:
    try:
        k8s.CustomObjectsApi(installation.plane.api_client()).create_cluster_custom_object(*NODEIMAGES, obj,
                                                                                          dry_run="All")
    except k8s.ApiException as exc:
        assert exc.status == 422, exc.body
        return False
    return True


def test_an_upgrade_from_the_previous_release_under_a_stream_fails_none_and_brings_the_crds_rules(
        failing_closed, tmp_path):
    """The chart's README, "Upgrading": 0.1.0 installed, then `helm upgrade --take-ownership` to
    this chart while Jobs stream in (failurePolicy Fail, so a call no replica answers fails its
    creation), then uninstalled. Both releases run this build's image from the page's registry:
    what is upgraded here is the chart and its CRD, not the code."""
    held = failing_closed
    old = tmp_path / "previous"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "deploy/chart/image-preflight"],
                             capture_output=True, check=False)
    assert archive.returncode == 0, f"this test reads the previous release from the clone's history: {archive.stderr!r}"
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    chart = old / "deploy" / "chart" / "image-preflight"
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["version"] == PREVIOUS_VERSION
    # A cluster new to the chart: the CRD the uninstall above kept goes, as 0.1.0 installs its own.
    held.plane.kubectl("delete", "crd", "nodeimages.image-preflight.io", "--ignore-not-found", "--wait")
    repository, _, tag = held.image.rpartition(":")
    try:
        held.helm("install", "image-preflight", str(chart), "--create-namespace", '--set agent.criSocket="$CRI_SOCKET"',
                  "--set webhook.failurePolicy=Fail", f"--set image.repository={repository},image.tag={tag}",
                  "--wait", "--timeout 5m")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{held.describe()}") from None
    held.wait_rolled_out()
    assert _admits(held, _list_leased_for(7200))  # 0.1.0's CRD bounds no lease
    try:
        with stream(held) as creations:
            creations.wait_count(20)
            held.helm("upgrade", "image-preflight", "deploy/chart/image-preflight", "--take-ownership",
                      "--reset-then-reuse-values", "--wait", "--timeout 5m")
            held.wait_rolled_out()
            assert {p.spec.containers[0].image for p in held.webhook_pods()} == {held.image}
            creations.wait_more()
        creations.assert_every_answer_right(at_least=10)
        FIGURES["previous_release_upgrade_creations"] = creations.total
        # The upgrade brought the CRD's newer rules: a lease over an hour is refused now.
        wait_for(lambda: not _admits(held, _list_leased_for(7200)), "the upgraded CRD in force", timeout_s=30)
        assert _admits(held, _list_leased_for(3600))
    finally:
        held.helm("uninstall", "image-preflight", "--wait", "--timeout 5m")
    admission = k8s.AdmissionregistrationV1Api(held.plane.api_client())
    assert [c.metadata.name for c in admission.list_validating_webhook_configuration().items
            if c.metadata.name.startswith("image-preflight")] == []
    assert k8s.CustomObjectsApi(held.plane.api_client()).list_cluster_custom_object(*NODEIMAGES)["items"] == []
