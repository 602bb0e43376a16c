"""`image-preflight doctor` on a real control plane of its own, each finding provoked for real.

No kubelet runs here, so the tests act as the kubelet where one would: they post node status, mark
the webhook's Pods ready (as the kubelet does once its readiness probe passes) and serve a kubelet's
configz (tests/controlplane/cmd/kubelet-configz). `serve` runs beside the cluster and is reached by
the apiserver at the Service's ClusterIP, as in tests/test_cluster_webhook.py.
"""

from __future__ import annotations

import base64

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import (
    create_node,
    kubelet_configz,
    running_control_plane,
    unreachable_kubeconfig,
    wait_for,
)
from tests.controlplane.webhook import ServedWebhook
from tests.test_deploy import NAMESPACE, SELF_SIGNED, SERVICE, deploy_copy  # noqa: F401 - fixture
from image_preflight.cli import main
from image_preflight.core.runtime_inventory import GROUP, PLURAL, VERSION, format_time

ROLLOUTS = "rollouts"
ENFORCE = {"image-preflight.io/enforce": "true"}
FILLER = [[f"docker.io/library/filler-{n}:v1"] for n in range(60)]


@pytest.fixture(scope="module")
def plane(tmp_path_factory, deploy_copy):  # noqa: F811 - fixture
    """A cluster of this module's own: the doctor reads every node and namespace in it."""
    with running_control_plane(tmp_path_factory.mktemp("doctor-controlplane")) as started:
        started.kubectl("apply", "--server-side", "-k", str(deploy_copy / "agent"))
        started.kubectl("apply", "--server-side", "-k", str(deploy_copy / SELF_SIGNED))
        core = started.core()
        core.create_namespace({"metadata": {"name": ROLLOUTS, "labels": ENFORCE}})
        core.create_namespace({"metadata": {"name": "elsewhere"}})
        create_node(started, "cpu-1", images=FILLER[:5], taints=[])
        _set_webhook_pods_ready(started, True)
        yield started


@pytest.fixture(scope="module")
def served(plane, deploy_copy, tmp_path_factory):  # noqa: F811 - fixture
    folder = tmp_path_factory.mktemp("doctor")
    kubeconfig = plane.service_account_kubeconfig("image-preflight", "image-preflight", folder / "sa.kubeconfig")
    webhook = ServedWebhook(plane, deploy_copy / SELF_SIGNED / "certs", kubeconfig, folder / "serve.log")
    webhook.start()
    with kubelet_configz(plane, "cpu-1", "10.250.1.1"):
        yield webhook
    webhook.stop()


def _set_webhook_pods_ready(plane, ready: bool) -> None:
    """What the kubelet posts for the webhook's Pods once they run and pass (or fail) readiness."""
    core = plane.core()
    selector = "app.kubernetes.io/name=image-preflight"
    apps = k8s.AppsV1Api(core.api_client)
    replicas = apps.read_namespaced_deployment(SERVICE, NAMESPACE).spec.replicas

    def scheduled():
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return len(pods) == replicas and all(p.spec.node_name for p in pods) and pods

    pods = wait_for(scheduled, "the webhook's Pods are scheduled")
    status = "True" if ready else "False"
    for number, pod in enumerate(pods):
        core.patch_namespaced_pod_status(pod.metadata.name, NAMESPACE, {"status": {
            "phase": "Running", "podIP": f"10.244.0.{10 + number}", "podIPs": [{"ip": f"10.244.0.{10 + number}"}],
            "conditions": [{"type": t, "status": status} for t in ("Initialized", "Ready", "ContainersReady",
                                                                    "PodScheduled")],
            "containerStatuses": [{"name": "webhook", "ready": ready, "restartCount": 0, "image": "image-preflight",
                                   "imageID": "", "started": True, "state": {"running": {}}}]}})
    want = len(pods) if ready else 0
    wait_for(lambda: (apps.read_namespaced_deployment(SERVICE, NAMESPACE).status.ready_replicas or 0) == want,
             f"the Deployment counts {want} ready replicas")


def doctor(plane, served, capsys, *extra: str) -> tuple[int, list[str]]:
    code = main(["doctor", "--kubeconfig", str(plane.kubeconfig), "--namespace", ROLLOUTS,
                 "--webhook-address", f"127.0.0.1:{served.port}", *extra])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out.splitlines()


def _problems(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("problem:")]


def test_a_healthy_cluster_has_no_problems(plane, served, capsys):
    code, lines = doctor(plane, served, capsys)
    assert (code, _problems(lines)) == (0, []), "\n".join(lines)
    text = "\n".join(lines)
    assert "ok: the caBundle verifies the certificate served at 127.0.0.1" in text
    assert f"ok: the apiserver calls the webhook: a dry-run Job in {ROLLOUTS} was denied" in text
    assert "2 ready webhook endpoint(s)" in text
    assert f"{ROLLOUTS} (AGL_NAMESPACE) among them" in text
    assert "ok: node cpu-1: complete list in node status (5 images, under the cap of 50, from its configz)" in text
    assert "ok: rollout pods may land on 1 node(s): cpu-1" in text


def test_the_rollout_namespace_not_opted_in_is_a_problem_with_its_label_command(plane, served, capsys):
    code, lines = doctor(plane, served, capsys, "--namespace", "elsewhere")
    assert code == 1
    assert _problems(lines) == ["problem: namespace elsewhere (AGL_NAMESPACE), where agent-lightning creates its Jobs, "
                                "is not opted in: its rollouts are not checked; fix: kubectl label namespace elsewhere "
                                "image-preflight.io/enforce=true"]


def test_node_lists_capped_uncapped_and_stale(plane, served, capsys, tmp_path):
    create_node(plane, "capped", images=FILLER[:50], taints=[])
    create_node(plane, "uncapped", images=FILLER, taints=[])
    custom = k8s.CustomObjectsApi(plane.core().api_client)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeImages", "metadata": {"name": "cpu-1"},
        "spec": {"nodeName": "cpu-1", "observedAt": format_time(1_000_000_000), "leaseDurationSeconds": 60,
                 "images": [{"id": "sha256:" + "a" * 64, "repoTags": ["docker.io/library/filler-0:v1"]}]}})
    try:
        with kubelet_configz(plane, "uncapped", "10.250.1.2", max_images=-1):
            code, lines = doctor(plane, served, capsys)
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "cpu-1")
        plane.core().delete_node("capped")
        plane.core().delete_node("uncapped")
    text = "\n".join(lines)
    assert code == 1
    assert ("problem: node capped: node status lists 50 images, at the kubelet's cap of 50 (assumed; its configz is "
            "not readable): an image absent from it is unknown, not missing; fix: kubectl apply -k deploy/agent") in text
    assert "ok: node uncapped: complete list in node status (60 images, no cap, from its configz)" in text
    assert "problem: node cpu-1: the node agent's list went stale" in text
    assert "skipped: kubelet configz unreadable on capped" in text


def test_an_untainted_gpu_node_takes_rollouts(plane, served, capsys):
    create_node(plane, "gpu-1", images=FILLER[:3], taints=[])
    create_node(plane, "gpu-2", images=FILLER[:3],
                taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    core = plane.core()
    for name in ("gpu-1", "gpu-2"):
        core.patch_node_status(name, {"status": {"capacity": {"nvidia.com/gpu": "8"},
                                                 "allocatable": {"nvidia.com/gpu": "8"}}})
    try:
        code, lines = doctor(plane, served, capsys)
    finally:
        core.delete_node("gpu-1")
        core.delete_node("gpu-2")
    assert code == 1
    assert _problems(lines) == ["problem: rollout pods may land on GPU node gpu-1: no taint keeps them off, and it "
                                "does not build the rollout images; fix: kubectl taint node gpu-1 "
                                "nvidia.com/gpu=present:NoSchedule"]


def test_webhook_pods_not_ready(plane, served, capsys):
    _set_webhook_pods_ready(plane, False)
    try:
        wait_for(lambda: "no ready webhook pod" in "\n".join(doctor(plane, served, capsys)[1]),
                 "the endpoints drop the unready pods", timeout_s=30)
        code, lines = doctor(plane, served, capsys)
    finally:
        _set_webhook_pods_ready(plane, True)
    assert code == 1
    assert ("problem: no ready webhook pod behind Service image-preflight/image-preflight: the apiserver cannot call "
            "it, and failurePolicy Ignore admits every object unchecked") in "\n".join(lines)
    assert any("Deployment image-preflight/image-preflight: 0 of 2 replicas ready" in line for line in lines)


def test_a_ca_bundle_that_does_not_verify_the_served_certificate(plane, served, capsys, tmp_path):
    assert main(["certs", "--service", SERVICE, "--namespace", NAMESPACE, "--out-dir", str(tmp_path)]) == 0
    admission = k8s.AdmissionregistrationV1Api(plane.core().api_client)
    original = admission.read_validating_webhook_configuration("image-preflight").webhooks[0].client_config.ca_bundle
    other = base64.b64encode((tmp_path / "ca.crt").read_bytes()).decode()
    patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": other}]
    admission.patch_validating_webhook_configuration("image-preflight", patch)
    try:
        # The apiserver's webhook client follows the configuration within moments.
        lines = wait_for(lambda: (found := doctor(plane, served, capsys)[1]) and any(
            "was admitted" in line for line in found) and found, "the apiserver uses the new caBundle", timeout_s=30)
    finally:
        restore = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": original}]
        admission.patch_validating_webhook_configuration("image-preflight", restore)
    problems = "\n".join(_problems(lines))
    assert ("problem: the caBundle of image-preflight does not verify the certificate the webhook serves for "
            "image-preflight.image-preflight.svc: unable to get local issuer certificate") in problems
    assert f"problem: a dry-run Job in {ROLLOUTS} that the webhook must deny was admitted" in problems
    wait_for(lambda: doctor(plane, served, capsys)[0] == 0, "healthy again once restored", timeout_s=30)


def test_no_webhook_configuration(plane, served, capsys, deploy_copy):  # noqa: F811 - fixture
    admission = k8s.AdmissionregistrationV1Api(plane.core().api_client)
    admission.delete_validating_webhook_configuration("image-preflight")
    try:
        code, lines = doctor(plane, served, capsys)
    finally:
        plane.kubectl("apply", "--server-side", "-k", str(deploy_copy / SELF_SIGNED))
    assert code == 1
    assert _problems(lines)[0] == ("problem: no ValidatingWebhookConfiguration holds the webhook "
                                   "validate.image-preflight.io: nothing is checked; fix: kubectl apply -k "
                                   "deploy/overlays/cert-manager (or deploy/overlays/self-signed)")


def test_a_cluster_that_cannot_be_read_exits_2_with_one_line(tmp_path, capsys):
    kubeconfig = unreachable_kubeconfig(tmp_path / "kubeconfig")
    assert main(["doctor", "--kubeconfig", str(kubeconfig)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("image-preflight doctor: cannot list nodes: ") and err.count("\n") == 1


@pytest.mark.parametrize(("labels", "selected"), [
    ({"image-preflight.io/enforce": "true", "kubernetes.io/metadata.name": "rollouts"}, True),
    ({"image-preflight.io/enforce": "false", "kubernetes.io/metadata.name": "rollouts"}, False),
    ({"image-preflight.io/enforce": "true", "kubernetes.io/metadata.name": "kube-system"}, False),
    ({"kubernetes.io/metadata.name": "rollouts"}, False),
])
def test_the_namespace_selector_of_deploy_base_is_read_as_the_apiserver_reads_it(labels, selected):
    """k8s.io/apimachinery/pkg/apis/meta/v1, LabelSelectorAsSelector: matchLabels and every
    expression must hold."""
    import yaml

    from image_preflight.doctor.findings import selects
    from tests.test_deploy import DEPLOY

    configuration = yaml.safe_load((DEPLOY / "base" / "webhook.yaml").read_text())
    assert selects(configuration["webhooks"][0]["namespaceSelector"], labels) is selected
    assert selects({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, labels) is True
    assert selects({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, labels) is False


# --- pure findings ---------------------------------------------------------------------------------


def _node(name: str) -> dict:
    return {"metadata": {"name": name}, "status": {"images": [{"names": ["docker.io/library/filler-0:v1"]}]}}


def _published(name: str, sandbox: dict | None, observed_at: float = 1_000_000_000, lease: int = 300) -> dict:
    from image_preflight.core.runtime_inventory import runtime_object

    return runtime_object(name, [{"id": "sha256:" + "a" * 64, "repoTags": ["docker.io/library/filler-0:v1"]}],
                          observed_at=observed_at, lease_seconds=lease, sandbox_image=sandbox)


def test_a_node_whose_runtime_lacks_its_sandbox_image_is_named_with_the_fix():
    from image_preflight.doctor.findings import PROBLEM, node_lists

    pause = "registry.k8s.io/pause:3.10.1"
    found = node_lists([_node("cpu-1"), _node("cpu-2"), _node("cpu-3")],
                       [_published("cpu-1", {"name": pause, "present": False}),
                        _published("cpu-2", {"name": pause, "present": True}), _published("cpu-3", None)],
                       {}, 50, now=1_000_000_010)
    problems = [f.line() for f in found if f.status == PROBLEM]
    assert problems == [
        "problem: node cpu-1: its container runtime lacks its sandbox image 'registry.k8s.io/pause:3.10.1': no pod "
        "can start there (each waits in ContainerCreating, Event FailedCreatePodSandBox); fix: on node cpu-1, ctr -n "
        "k8s.io images import pause.tar (the image saved with `ctr -n k8s.io images export pause.tar "
        "registry.k8s.io/pause:3.10.1` where it is held), then ctr -n k8s.io images label "
        "registry.k8s.io/pause:3.10.1 io.cri-containerd.pinned=pinned so that image garbage collection keeps it"]


def test_a_stale_sandbox_report_is_not_a_sandbox_finding():
    from image_preflight.doctor.findings import node_lists

    stale = _published("cpu-1", {"name": "pause:3.9", "present": False}, lease=5)
    lines = [f.line() for f in node_lists([_node("cpu-1")], [stale], {}, 50, now=1_000_000_010)]
    assert not any("sandbox" in line for line in lines) and any("went stale" in line for line in lines)


def test_a_malformed_sandbox_report_is_one_line_naming_the_field():
    from image_preflight.doctor.findings import node_lists

    broken = _published("cpu-1", None)
    broken["spec"]["sandboxImage"] = {"name": "registry.k8s.io/pause:3.10.1", "present": "no"}
    (first, *_) = node_lists([_node("cpu-1")], [broken], {}, 50, now=1_000_000_010)
    assert first.line() == ("problem: a NodeImages object cannot be read: spec.sandboxImage.present: missing or "
                            "not a boolean")


@pytest.mark.parametrize("policy, problem", [("Fail", True), ("Ignore", False)])
def test_failure_policy_fail_is_named_with_what_it_does_to_agent_lightning(policy, problem):
    """Measured in tests/test_real_node_agentlightning.py: under Fail an outage leaves rollouts queuing."""
    from image_preflight.doctor.findings import PROBLEM, webhook_configuration

    configuration = {"metadata": {"name": "image-preflight"}, "webhooks": [{
        "name": "validate.image-preflight.io", "failurePolicy": policy,
        "clientConfig": {"caBundle": base64.b64encode(b"ca").decode(),
                         "service": {"namespace": "image-preflight", "name": "image-preflight"}}}]}
    found, _ = webhook_configuration([configuration])
    lines = [f.line() for f in found if f.status == PROBLEM]
    assert bool(lines) == problem
    if problem:
        assert "rollouts stay queuing" in lines[0] and "components/watchdog" in lines[0]


def _replica(name: str, *, ready: bool, waiting: dict | None = None, deleting: bool = False) -> dict:
    return {"metadata": {"namespace": "image-preflight", "name": name,
                         **({"deletionTimestamp": "2026-12-01T00:00:00Z"} if deleting else {})},
            "spec": {"nodeName": "cpu-1"},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "webhook", "image": "image-preflight:0.1.0",
                                              "state": {"waiting": waiting} if waiting else {"running": {}}}]}}


def test_a_replica_waiting_for_its_own_image_is_named_with_its_node_and_the_import():
    """The kubelet's waiting reasons for an image it cannot get (pkg/kubelet/images/types.go)."""
    from image_preflight.doctor.findings import PROBLEM, WebhookTarget, deployment
    target = WebhookTarget("image-preflight", "image-preflight", "image-preflight", 443, b"", {}, "Fail")
    pods = [_replica("a", ready=True),
            _replica("b", ready=False, waiting={"reason": "ErrImagePull", "message": "not found"}),
            _replica("c", ready=False, waiting={"reason": "CrashLoopBackOff", "message": "back-off 10s"}),
            _replica("d", ready=False, waiting={"reason": "ErrImagePull"}, deleting=True)]
    found = deployment(target, 1, (1, 3), pods)
    texts = [f.text for f in found if f.status == PROBLEM]
    assert texts[0] == "Deployment image-preflight/image-preflight: 1 of 3 replicas ready"
    assert texts[1] == ("Pod image-preflight/b: image image-preflight:0.1.0 is not on node cpu-1 (ErrImagePull): "
                        "load it there (docs/deploy.md, step 2)")
    assert "ctr -n k8s.io images import" in found[2].fix and "cpu-1" in found[2].fix
    assert texts[2] == "Pod image-preflight/c: container webhook waits (CrashLoopBackOff: back-off 10s)"
    assert len(texts) == 3  # a terminating Pod is on its way out
