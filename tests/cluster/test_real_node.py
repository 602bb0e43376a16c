"""The failure image-preflight prevents, on a real node: a kubelet and containerd 2.x
(tests/node/real_node.py) registered with a control plane of their own, the webhook and the
watchdog running beside them with their ServiceAccounts, `deploy/` applied.

Every status read here is the kubelet's own: pull failures, node status and its cap, configz.
Images are built from busybox and imported as `pull_images.py` + `ctr images import` leave them;
every registry resolves to the fixture's stub, so a pull of an absent image fails as it does for
a locally built image that was never pushed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

import image_preflight
from image_preflight.core.sources.node_status import CAP_ANNOTATION
from image_preflight.core.watchdog import job_failure
from tests.cluster.real_stack import (
    ABSENT,
    DENIED,
    GRACE_S,
    HELD,
    WATCHDOG_BOUND_S,
    apply_without_pods,
    delete_node_images,
    doctor,
    job_name,
    node_images,
    running_agent,
    stuck_job_fails,
)
from tests.controlplane.cluster import create_node, wait_for
from tests.needs import record_figures
from tests.node.images import PAUSE_NAME, swe_smith_image
from tests.node.real_node import NODE_NAME

FIGURES: dict[str, float] = {}


# --- admission against what the kubelet reports --------------------------------------------------


def test_a_rollout_job_whose_image_the_node_holds_runs_there_and_completes(stack):
    namespace = stack.namespace()
    job = stack.create(namespace, stack.rollout(HELD))
    name = job_name(job)
    wait_for(lambda: stack.job_condition(namespace, name, "Complete"), f"Job {name} Complete", timeout_s=90)
    (pod,) = stack.pods(namespace, name)
    assert pod.spec.node_name == NODE_NAME and pod.status.phase == "Succeeded"
    log = stack.core.read_namespaced_pod_log(pod.metadata.name, namespace)
    assert "rollout: python /agl/agents/smith_agent.py" in log
    assert job_failure.ANNOTATION not in (stack.batch.read_namespaced_job(name, namespace).metadata.annotations or {})


def test_a_rollout_job_whose_image_the_node_lacks_is_denied_at_create(stack):
    namespace = stack.namespace()
    with pytest.raises(ApiException) as denied:
        stack.create(namespace, stack.rollout(ABSENT))
    assert denied.value.status == 422
    message = json.loads(denied.value.body)["message"]
    assert message.startswith(DENIED) and ABSENT in message and NODE_NAME in message
    assert stack.batch.list_namespaced_job(namespace).items == []


def test_node_status_below_the_cap_lists_every_image_so_absence_is_proof(stack):
    """pkg/kubelet/nodestatus/setters.go Images: every image when fewer than nodeStatusMaxImages."""
    listed = {name for names in stack.node.status_names() for name in names}
    # The runtime's own `sha256:<id>` references are ids, which node status does not repeat as names.
    assert {n for n in stack.node.image_names() if not n.startswith("sha256:")} <= listed
    code, _ = stack.dry_run(stack.namespace(), ABSENT)
    assert code != 0


def test_an_image_imported_after_a_denial_is_admitted_once_the_kubelet_reports_it(stack):
    """The window that remains with node status alone: the kubelet's image list is refreshed
    every 30 s and node status posted every 10 s (pkg/kubelet/kubelet.go, imageManager)."""
    namespace = stack.namespace()
    image = swe_smith_image("later", "arrives", uuid.uuid4().hex)
    FIGURES["import to first admitted Job, node status"] = seconds_to_admission(stack, namespace, image, 90, 0.5)
    assert FIGURES["import to first admitted Job, node status"] < 75


def test_past_the_cap_node_status_proves_nothing_and_the_agent_makes_it_missing(stack, tmp_path):
    """The kubelet posts the 50 largest images (setters.go Images, sorted by size); an image the
    list lacks may still be on the node, so the decision is unknown (admitted with a warning) until
    the agent publishes the runtime's complete list, which makes it missing (denied)."""
    fillers = [swe_smith_image("filler", f"repo{i}", f"{i:08x}") for i in range(55)]
    stack.node.import_images(fillers)
    try:
        wait_for(lambda: len(stack.node.status_names()) == 50, "the kubelet posts 50 images", timeout_s=90)
        namespace = stack.namespace()
        code, warnings = stack.dry_run(namespace, ABSENT)
        assert code == 0 and "Warning:" in warnings and ABSENT in warnings, warnings
        assert f"node {NODE_NAME}: node status lists 50 images, at the kubelet's cap of 50" in doctor(stack)
        with running_agent(stack, tmp_path):
            wait_for(lambda: stack.dry_run(namespace, ABSENT)[0] != 0, "the agent's list makes ABSENT missing",
                     timeout_s=60)
            assert f"node {NODE_NAME}: complete list from the node agent" in doctor(stack)
            obj = k8s.CustomObjectsApi(stack.core.api_client).get_cluster_custom_object(
                "image-preflight.io", "v1alpha1", "nodeimages", NODE_NAME)
            names = {n for image in obj["spec"]["images"] for n in image["repoTags"]}
            assert set(fillers) | {HELD} <= names and len(obj["spec"]["images"]) > 50
    finally:
        stack.node.remove_images(*fillers)
        k8s.CustomObjectsApi(stack.core.api_client).delete_collection_cluster_custom_object(
            "image-preflight.io", "v1alpha1", "nodeimages")
        # Later tests rely on a list below the cap again.
        wait_for(lambda: len(stack.node.status_names()) < 50, "the kubelet posts fewer than 50 images",
                 timeout_s=90)


# --- the kubelet's configz through the apiserver ---------------------------------------------------


def test_inventory_dump_reads_the_real_kubelets_cap_from_configz(stack, tmp_path):
    out = tmp_path / "cluster.json"
    assert stack.node.configz()["nodeStatusMaxImages"] == 50  # the kubelet's default, unset in its file
    assert dumped_cap(inventory_dump(stack, out)) == "50"


def test_an_uncapped_kubelet_lists_every_image_and_says_so_in_configz(stack, tmp_path):
    """nodeStatusMaxImages -1 (pkg/kubelet/nodestatus/setters.go Images: no cap): node status is
    complete past 50, configz says -1, and absence is proof without the agent."""
    fillers = [swe_smith_image("uncapped", f"repo{i}", f"{i:08x}") for i in range(55)]
    stack.node.restart_kubelet(nodeStatusMaxImages=-1)
    try:
        stack.node.import_images(fillers)
        wait_for(lambda: len(stack.node.status_names()) > 55, "the kubelet posts every image", timeout_s=90)
        dump = tmp_path / "cluster.json"
        assert dumped_cap(inventory_dump(stack, dump)) == "-1"
        # From the dump, whose cap the kubelet's configz gave: the scanner's and the API's decision.
        (verdict,) = image_preflight.decide(stack.rollout(ABSENT), image_preflight.load_inventory(dump)).verdicts
        assert verdict.missing_on == (NODE_NAME,) and verdict.unknown_on == ()
        # `serve` has no configz: its --max-images (50) makes the 57-image list proof of nothing.
        code, warnings = stack.dry_run(stack.namespace(), ABSENT)
        assert code == 0 and "Warning:" in warnings, warnings
        assert f"node {NODE_NAME}: complete list in node status" in doctor(stack)
    finally:
        stack.node.remove_images(*fillers)
        stack.node.restart_kubelet(nodeStatusMaxImages=None)
        wait_for(lambda: len(stack.node.status_names()) < 50, "the kubelet posts fewer than 50 images",
                 timeout_s=90)


def test_doctor_tells_whether_the_webhook_is_registered_and_its_fix_works(stack):
    registered = doctor(stack)
    assert "ValidatingWebhookConfiguration image-preflight sends reviews to Service" in registered
    assert "the apiserver calls the webhook: a dry-run Job" in registered
    stack.plane.kubectl("delete", "validatingwebhookconfiguration", "image-preflight")
    try:
        gone = doctor(stack)
        (line,) = [x for x in gone.splitlines() if "no ValidatingWebhookConfiguration holds the webhook" in x]
        assert "fix: helm install image-preflight deploy/chart/image-preflight" in line, line
    finally:
        apply_without_pods(stack.plane, stack.values)
    wait_for(lambda: "the apiserver calls the webhook: a dry-run Job" in doctor(stack),
             "the re-applied configuration is called", timeout_s=60, interval_s=1)


# --- the watchdog on the kubelet's own statuses ----------------------------------------------------


def test_an_absent_if_not_present_image_fails_its_pull_and_the_watchdog_fails_the_job(stack):
    namespace = stack.namespace()
    recorded, seen = stuck_job_fails(stack, namespace, stack.rollout(ABSENT), {"ErrImagePull", "ImagePullBackOff"})
    assert recorded["reason"] in ("ErrImagePull", "ImagePullBackOff") and recorded["image"] == ABSENT
    assert any(ABSENT.split(":")[0].removeprefix("docker.io/") in line for line in stack.node.registry_requests())


def test_an_absent_never_image_and_an_invalid_name_are_failed_too(stack):
    namespace = stack.namespace()
    never = stack.rollout(ABSENT)
    never["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    recorded, _ = stuck_job_fails(stack, namespace, never, {"ErrImageNeverPull"})
    assert recorded["reason"] == "ErrImageNeverPull"
    invalid = stack.rollout("docker.io/jyangballin/SWESmith.Upper:openai")
    recorded, _ = stuck_job_fails(stack, namespace, invalid, {"InvalidImageName"})
    assert recorded["reason"] == "InvalidImageName"


def test_a_held_image_in_the_same_namespace_is_never_touched(stack):
    namespace = stack.namespace()
    with stack.webhook_unreachable():
        held = stack.create(namespace, stack.rollout(HELD))
    name = job_name(held)
    wait_for(lambda: stack.job_condition(namespace, name, "Complete"), f"{name} Complete", timeout_s=90)
    time.sleep(GRACE_S)
    assert job_failure.ANNOTATION not in (stack.batch.read_namespaced_job(name, namespace).metadata.annotations or {})


def test_an_image_removed_after_admission_is_caught(stack):
    """As image GC does between admission and start: the Job is admitted while the node holds
    the image, the image goes, and its next Pod cannot start."""
    namespace = stack.namespace()
    image = swe_smith_image("collected", "later", uuid.uuid4().hex)
    stack.node.import_images([image])
    stack.node.wait_in_status(image)
    job = stack.rollout(image)
    job["spec"].update({"completions": 2, "parallelism": 1})
    name = job_name(stack.create(namespace, job))
    wait_for(lambda: any(p.status.phase in ("Running", "Succeeded") for p in stack.pods(namespace, name)),
             "the first Pod started", timeout_s=60)
    stack.node.remove_images(image)
    condition = wait_for(lambda: stack.job_condition(namespace, name, "Failed"), f"{name} Failed",
                         timeout_s=WATCHDOG_BOUND_S + 30)
    assert condition["reason"] == "DeadlineExceeded"
    assert job_failure.ANNOTATION in (stack.batch.read_namespaced_job(name, namespace).metadata.annotations or {})


# --- steering, with a second node that lacks the image ---------------------------------------------


def test_a_steered_pod_is_bound_to_the_node_holding_its_image_and_runs(stack):
    lacking = f"api-node-{uuid.uuid4().hex[:6]}"
    create_node(stack.plane, lacking, taints=[], images=[[f"docker.io/library/filler-{i}:v1"] for i in range(3)])
    try:
        namespace = stack.namespace()
        job = stack.rollout(HELD)
        job["spec"].update({"completions": 4, "parallelism": 4})
        name = job_name(stack.create(namespace, job))
        wait_for(lambda: stack.job_condition(namespace, name, "Complete"), f"{name} Complete", timeout_s=120)
        pods = stack.pods(namespace, name)
        assert {p.spec.node_name for p in pods} == {NODE_NAME}
        assert all("image-preflight.io/steered-to" in (p.metadata.annotations or {}) for p in pods)
    finally:
        stack.core.delete_node(lacking)


def inventory_dump(stack, out: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "image_preflight", "inventory", "dump", "--kubeconfig",
                           str(stack.plane.kubeconfig), "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def dumped_cap(dumped: dict) -> str | None:
    """The cap `inventory dump` wrote for the real node (from its kubelet's configz)."""
    (node,) = [item for item in dumped["items"] if item.get("kind", "Node") == "Node"
               and item["metadata"]["name"] == NODE_NAME]
    return (node["metadata"].get("annotations") or {}).get(CAP_ANNOTATION)


# --- a change of images within a second, and a node without its sandbox image ---------------------


def test_with_the_agent_an_import_is_admitted_within_seconds(stack, tmp_path):
    """containerd's image events wake the agent (agent/events.py); the periodic list (600 s here)
    would not. Compare test_an_image_imported_after_a_denial_is_admitted_once_the_kubelet_reports_it."""
    namespace = stack.namespace()
    image = swe_smith_image("evented", "arrives", uuid.uuid4().hex)
    try:
        with running_agent(stack, tmp_path, "--interval", "600", "--lease", "3600"):
            wait_for(lambda: node_images(stack) is not None, "the agent's first NodeImages")
            FIGURES["import to first admitted Job, agent"] = seconds_to_admission(stack, namespace, image, 30, 0.1)
    finally:
        delete_node_images(stack)
    assert FIGURES["import to first admitted Job, agent"] < 5


def test_a_node_without_its_sandbox_image_is_denied_failed_and_named(stack, tmp_path):
    """The kubelet creates a Pod's sandbox before it looks at its images; containerd without its
    pause image fails RunPodSandbox (FailedCreatePodSandBox), so every Pod there hangs. containerd
    2.x keeps the sandbox image out of CRI Status: the agent is told it (--sandbox-image)."""
    namespace = stack.namespace()
    try:
        with running_agent(stack, tmp_path, "--sandbox-image", PAUSE_NAME):
            wait_for(lambda: (node_images(stack) or {}).get("spec", {}).get("sandboxImage") == {
                "name": PAUSE_NAME, "present": True}, "the agent reports the sandbox image present")
            stack.node.remove_images(PAUSE_NAME)
            wait_for(lambda: stack.dry_run(namespace, HELD)[0] != 0, "a held image is denied on a halted node")
            _, message = stack.dry_run(namespace, HELD)
            assert DENIED in message and PAUSE_NAME in message and "sandbox image" in message, message
            assert f"node {NODE_NAME}: its container runtime lacks its sandbox image" in doctor(stack)
            recorded, _ = stuck_job_fails(stack, namespace, stack.rollout(HELD), set())
            assert recorded["reason"] == "FailedCreatePodSandBox", recorded
            reasons = {e.reason for e in stack.core.list_namespaced_event(namespace).items}
            assert "FailedCreatePodSandBox" in reasons, reasons
            stack.node.import_images([PAUSE_NAME], pause=True)
            wait_for(lambda: stack.dry_run(namespace, HELD)[0] == 0, "admitted once the pause image is back")
    finally:
        if PAUSE_NAME not in stack.node.image_names():
            stack.node.import_images([PAUSE_NAME], pause=True)
        delete_node_images(stack)


def seconds_to_admission(stack, namespace: str, image: str, timeout_s: float, interval_s: float) -> float:
    """From importing an image the webhook denies now to its first admitted dry-run Job."""
    assert stack.dry_run(namespace, image)[0] != 0
    start = time.monotonic()
    stack.node.import_images([image])
    wait_for(lambda: stack.dry_run(namespace, image)[0] == 0, f"{image} admitted", timeout_s=timeout_s,
             interval_s=interval_s)
    return time.monotonic() - start


@pytest.fixture(scope="module", autouse=True)
def _figures():
    yield
    record_figures(FIGURES)
