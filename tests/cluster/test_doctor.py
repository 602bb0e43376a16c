"""`image-preflight doctor` on a real control plane of its own, each finding provoked for real.

No kubelet runs here, so the tests act as the kubelet where one would: they post node status, mark
the webhook's Pods ready (as the kubelet does once its readiness probe passes) and serve a kubelet's
configz (tests/controlplane/cmd/kubelet-configz). `serve` runs beside the cluster and is reached by
the apiserver at the Service's ClusterIP, as in tests/cluster/test_cluster_webhook.py.
"""

from __future__ import annotations

import base64
import time

import pytest
from kubernetes import client as k8s

from image_preflight.cli import main
from image_preflight.core.doctor.gc import grant_proxy
from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION, format_time
from tests.builders.stalls import ENFORCE_LABEL
from tests.chart import API_ONLY, NAMESPACE, SERVICE, apply, merged, render, secret_values
from tests.controlplane.cluster import (
    create_node,
    kubelet_configz,
    running_control_plane,
    unreachable_kubeconfig,
    wait_for,
)
from tests.controlplane.webhook import ServedWebhook

ROLLOUTS = "rollouts"
FILLER = [[f"docker.io/library/filler-{n}:v1"] for n in range(60)]
# Both write policies, as an install has them: this cluster's agents and watchdog never write.
GUARDED = {"agent": {"nodeRestriction": {"enabled": True}}}


def _apply_chart(plane, webhook_certs) -> None:
    apply(plane, merged(API_ONLY, secret_values(webhook_certs), GUARDED), watchdog_policy=True)


@pytest.fixture(scope="module")
def plane(tmp_path_factory, webhook_certs):
    """A cluster of this module's own: the doctor reads every node and namespace in it."""
    with running_control_plane(tmp_path_factory.mktemp("doctor-controlplane")) as started:
        _apply_chart(started, webhook_certs)
        core = started.core()
        core.create_namespace({"metadata": {"name": ROLLOUTS, "labels": ENFORCE_LABEL}})
        core.create_namespace({"metadata": {"name": "elsewhere"}})
        create_node(started, "cpu-1", images=FILLER[:5], taints=[])
        _set_webhook_pods_ready(started, True)
        yield started


@pytest.fixture(scope="module")
def served(plane, webhook_certs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("doctor")
    kubeconfig = plane.service_account_kubeconfig("image-preflight", "image-preflight", folder / "sa.kubeconfig")
    webhook = ServedWebhook(plane, webhook_certs, kubeconfig, folder / "serve.log")
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
    assert "skipped: no needed list (ConfigMap image-preflight-agent/needed-images does not exist)" in text


def test_needed_images_unpinned_and_the_kubelets_gc_settings_through_the_node_proxy(plane, served, capsys):
    """configz as the kubelet's own scheme defaults it (cmd/kubelet-configz); stats/summary, which
    that stand-in does not serve, answers 404 through the apiserver's node proxy."""
    core = plane.core()
    core.create_namespaced_config_map("image-preflight-agent", {"metadata": {"name": "needed-images"}, "data": {
        "needed.txt": "docker.io/library/filler-0:v1\ndocker.io/library/filler-1:v1\nNot A Reference\n"}})
    custom = k8s.CustomObjectsApi(core.api_client)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeImages", "metadata": {"name": "cpu-1"},
        "spec": {"nodeName": "cpu-1", "observedAt": format_time(time.time()), "leaseDurationSeconds": 300,
                 "images": [{"id": "sha256:" + "a" * 64, "repoTags": ["docker.io/library/filler-0:v1"],
                             "pinned": False},
                            {"id": "sha256:" + "b" * 64, "repoTags": ["docker.io/library/filler-1:v1"],
                             "pinned": True}]}})
    try:
        code, lines = doctor(plane, served, capsys)
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "cpu-1")
        core.delete_namespaced_config_map("needed-images", "image-preflight-agent")
    text = "\n".join(lines)
    assert code == 1
    assert "ok: ConfigMap image-preflight-agent/needed-images lists 2 needed image(s)" in text
    assert "problem: the needed list has lines that are not image references" in text and "line 3" in text
    assert ("problem: node cpu-1: 1 needed image(s) not pinned (docker.io/library/filler-0:v1): pinning is not "
            "enabled on its node agent, so the kubelet's image GC may delete them; fix: enable pinning") in text
    assert ("skipped: node cpu-1: its image filesystem's use (imageGCHighThresholdPercent 85, "
            "imageGCLowThresholdPercent 80, imageMinimumGCAge 2m0s, imageMaximumGCAge 0s; stats/summary: "
            "HTTP 404") in text


def test_without_nodes_proxy_each_node_is_one_skipped_line_not_a_failure(plane, served, capsys, tmp_path):
    """The webhook's ServiceAccount lists nodes (the chart's ClusterRole) but may not get nodes/proxy
    nor the needed list."""
    reader = plane.service_account_kubeconfig("image-preflight", "image-preflight", tmp_path / "sa.kubeconfig")
    code = main(["doctor", "--kubeconfig", str(reader), "--namespace", ROLLOUTS,
                 "--webhook-address", f"127.0.0.1:{served.port}"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and code != 2, captured.err
    lines = captured.out.splitlines()
    assert [line for line in lines if line.startswith("skipped: node cpu-1: its kubelet")] == [
        "skipped: node cpu-1: its kubelet's image GC settings and disk use (configz: HTTP 403; reading it needs get "
        "on nodes/proxy); fix: " + grant_proxy("cpu-1")]
    assert "--resource-name=cpu-1 " in grant_proxy("cpu-1")  # that node alone, never every kubelet
    assert ("skipped: the needed list (configmap image-preflight-agent/needed-images: HTTP 403; reading it needs get "
            "on configmaps in namespace image-preflight-agent)") in lines


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
            "not readable): an image absent from it is unknown, not missing; fix: helm upgrade image-preflight "
            "deploy/chart/image-preflight --namespace image-preflight --reuse-values --set agent.enabled=true") in text
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


def test_no_webhook_configuration(plane, served, capsys, webhook_certs):
    admission = k8s.AdmissionregistrationV1Api(plane.core().api_client)
    admission.delete_validating_webhook_configuration("image-preflight")
    try:
        code, lines = doctor(plane, served, capsys)
    finally:
        _apply_chart(plane, webhook_certs)
    assert code == 1
    assert _problems(lines)[0] == ("problem: no ValidatingWebhookConfiguration holds the webhook "
                                   "validate.image-preflight.io: nothing is checked; fix: helm install "
                                   "image-preflight deploy/chart/image-preflight --namespace image-preflight "
                                   "--create-namespace")


def test_the_write_policies_of_the_agent_and_the_watchdog_each_with_the_upgrade_that_restores_them(
        plane, served, capsys, webhook_certs):
    code, lines = doctor(plane, served, capsys)
    for name, face in (("image-preflight-agent-own-node", "the node agent"),
                       ("image-preflight-watchdog-writes", "the watchdog")):
        assert (f"ok: ValidatingAdmissionPolicy {name} and its binding (Deny) keep {face}'s writes to its own"
                in lines), lines
    admission = plane.kubectl
    admission("delete", "validatingadmissionpolicybinding", "image-preflight-watchdog-writes")
    admission("patch", "validatingadmissionpolicybinding", "image-preflight-agent-own-node", "--type=merge",
              "-p", '{"spec": {"validationActions": ["Warn"]}}')
    try:
        code, lines = doctor(plane, served, capsys)
    finally:
        # validationActions is a set: applied again, it would keep the patch's Warn beside Deny.
        admission("delete", "validatingadmissionpolicybinding", "image-preflight-agent-own-node")
        _apply_chart(plane, webhook_certs)
    assert code == 1
    assert _problems(lines) == [
        "problem: the node agent's writes are unguarded: ValidatingAdmissionPolicyBinding "
        "image-preflight-agent-own-node has validationActions [Warn], without Deny, so any agent's token may write "
        "every node's NodeImages; fix: helm upgrade image-preflight "
        "deploy/chart/image-preflight --namespace image-preflight --reuse-values "
        "--set agent.nodeRestriction.enabled=true",
        "problem: the watchdog's writes are unguarded: "
        "ValidatingAdmissionPolicyBinding image-preflight-watchdog-writes "
        "does not exist, so its token may patch any Job and create Pods in any namespace (and it does not start); "
        "fix: helm upgrade image-preflight deploy/chart/image-preflight "
        "--namespace image-preflight --reuse-values"]
    assert doctor(plane, served, capsys)[0] == 0  # the upgrade's objects, applied again


def test_a_write_policy_is_judged_only_where_its_face_is_installed_or_cannot_be_told():
    from image_preflight.core.doctor.findings import OK, PROBLEM, SKIPPED, WRITE_POLICIES, write_policy

    agent, watchdog = WRITE_POLICIES
    policy = {"metadata": {"name": watchdog.name}}
    binding = {"spec": {"policyName": watchdog.name, "validationActions": ["Deny", "Audit"]}}
    assert [f.status for f in write_policy(watchdog, True, (policy, binding), "ns")] == [OK]
    assert write_policy(watchdog, False, (None, None), "ns") == []  # not installed: nothing to guard
    (unknown,) = write_policy(watchdog, None, (None, None), "ns")
    assert unknown.status == SKIPPED and "ClusterRole image-preflight-watchdog is not readable" in unknown.text
    (unread,) = write_policy(agent, True, "validatingadmissionpolicies.admissionregistration.k8s.io x: HTTP 403", "ns")
    assert unread.status == SKIPPED and "HTTP 403" in unread.text
    (missing,) = write_policy(agent, True, (None, None), "ns")
    assert missing.status == PROBLEM
    assert "ValidatingAdmissionPolicy image-preflight-agent-own-node does not exist" in missing.text
    assert missing.fix.startswith("helm upgrade image-preflight deploy/chart/image-preflight --namespace ns ")
    (elsewhere,) = write_policy(watchdog, True,
                                (policy, {"spec": {"policyName": "other", "validationActions": ["Deny"]}}), "ns")
    assert "binds policy other, not image-preflight-watchdog-writes" in elsewhere.text


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
def test_the_namespace_selector_of_the_chart_is_read_as_the_apiserver_reads_it(labels, selected):
    """k8s.io/apimachinery/pkg/apis/meta/v1, LabelSelectorAsSelector: matchLabels and every
    expression must hold."""
    from image_preflight.core.doctor.findings import selects

    (configuration,) = [d for d in render() if d["kind"] == "ValidatingWebhookConfiguration"]
    assert selects(configuration["webhooks"][0]["namespaceSelector"], labels) is selected
    assert selects({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, labels) is True
    assert selects({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, labels) is False


# --- pure findings ---------------------------------------------------------------------------------


def _node(name: str) -> dict:
    return {"metadata": {"name": name}, "status": {"images": [{"names": ["docker.io/library/filler-0:v1"]}]}}


def _published(name: str, sandbox: dict | None, observed_at: float = 1_000_000_000, lease: int = 300) -> dict:
    from image_preflight.core.sources.runtime_lists import runtime_object

    return runtime_object(name, [{"id": "sha256:" + "a" * 64, "repoTags": ["docker.io/library/filler-0:v1"]}],
                          observed_at=observed_at, lease_seconds=lease, sandbox_image=sandbox)


def test_a_node_whose_runtime_lacks_its_sandbox_image_is_named_with_the_fix():
    from image_preflight.core.doctor.findings import PROBLEM, node_lists

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
    from image_preflight.core.doctor.findings import node_lists

    stale = _published("cpu-1", {"name": "pause:3.9", "present": False}, lease=5)
    lines = [f.line() for f in node_lists([_node("cpu-1")], [stale], {}, 50, now=1_000_000_010)]
    assert not any("sandbox" in line for line in lines) and any("went stale" in line for line in lines)


def test_a_malformed_sandbox_report_is_one_line_naming_the_field():
    from image_preflight.core.doctor.findings import node_lists

    broken = _published("cpu-1", None)
    broken["spec"]["sandboxImage"] = {"name": "registry.k8s.io/pause:3.10.1", "present": "no"}
    (first, *_) = node_lists([_node("cpu-1")], [broken], {}, 50, now=1_000_000_010)
    assert first.line() == ("problem: a NodeImages object cannot be read: spec.sandboxImage.present: missing or "
                            "not a boolean")


@pytest.mark.parametrize("policy, problem", [("Fail", True), ("Ignore", False)])
def test_failure_policy_fail_is_named_with_what_it_does_to_agent_lightning(policy, problem):
    """Measured in tests/cluster/test_real_node_agentlightning.py: under Fail an outage leaves rollouts queuing."""
    from image_preflight.core.doctor.findings import PROBLEM, webhook_configuration

    configuration = {"metadata": {"name": "image-preflight"}, "webhooks": [{
        "name": "validate.image-preflight.io", "failurePolicy": policy,
        "clientConfig": {"caBundle": base64.b64encode(b"ca").decode(),
                         "service": {"namespace": "image-preflight", "name": "image-preflight"}}}]}
    found, _ = webhook_configuration([configuration])
    lines = [f.line() for f in found if f.status == PROBLEM]
    assert bool(lines) == problem
    if problem:
        assert "rollouts stay queuing" in lines[0] and "--set watchdog.enabled=true" in lines[0]


def _replica(name: str, *, ready: bool, waiting: dict | None = None, deleting: bool = False) -> dict:
    return {"metadata": {"namespace": "image-preflight", "name": name,
                         **({"deletionTimestamp": "2026-12-01T00:00:00Z"} if deleting else {})},
            "spec": {"nodeName": "cpu-1"},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "webhook", "image": "image-preflight:0.1.0",
                                              "state": {"waiting": waiting} if waiting else {"running": {}}}]}}


def test_a_replica_waiting_for_its_own_image_is_named_with_its_node_and_the_import():
    """The kubelet's waiting reasons for an image it cannot get (pkg/kubelet/images/types.go)."""
    from image_preflight.core.doctor.findings import PROBLEM, WebhookTarget, deployment
    target = WebhookTarget("image-preflight", "image-preflight", "image-preflight", 443, b"", {}, "Fail")
    pods = [_replica("a", ready=True),
            _replica("b", ready=False, waiting={"reason": "ErrImagePull", "message": "not found"}),
            _replica("c", ready=False, waiting={"reason": "CrashLoopBackOff", "message": "back-off 10s"}),
            _replica("d", ready=False, waiting={"reason": "ErrImagePull"}, deleting=True)]
    found = deployment(target, 1, (1, 3), pods)
    texts = [f.text for f in found if f.status == PROBLEM]
    assert texts[0] == "Deployment image-preflight/image-preflight: 1 of 3 replicas ready"
    assert texts[1] == ("Pod image-preflight/b: image image-preflight:0.1.0 is not on node cpu-1 (ErrImagePull): "
                        "load it there (docs/quickstart.md, step 2)")
    assert "ctr -n k8s.io images import" in found[2].fix and "cpu-1" in found[2].fix
    assert texts[2] == "Pod image-preflight/c: container webhook waits (CrashLoopBackOff: back-off 10s)"
    assert len(texts) == 3  # a terminating Pod is on its way out


# --- the kubelet's image GC against the needed images (core/doctor/gc.py) ----------

NEEDED = ["docker.io/library/rollout-a:v1", "docker.io/library/rollout-b:v1", "docker.io/library/rollout-c:v1",
          "docker.io/library/rollout-d:v1"]
GIB = 2**30


def _agent(name: str, pinned: dict[str, bool], pinning: dict | None = None) -> dict:
    """A node agent's NodeImages object holding `pinned`'s images, each pinned or not, and a filler."""
    from image_preflight.core.sources.runtime_lists import runtime_object

    images = [{"id": "sha256:" + f"{n:x}" * 64, "repoTags": [ref], "pinned": pin}
              for n, (ref, pin) in enumerate(pinned.items(), start=1)]
    images.append({"id": "sha256:" + "f" * 64, "repoTags": ["docker.io/library/filler-0:v1"], "pinned": False})
    obj = runtime_object(name, images, observed_at=1_000_000_000, lease_seconds=300)
    if pinning is not None:
        obj["spec"]["pinning"] = pinning
    return obj


def _summary(used_percent: float, capacity: int = 100 * GIB) -> dict:
    """stats/summary as the kubelet serves it (pkg/kubelet/apis/stats/v1alpha1: node.runtime.imageFs)."""
    available = int(capacity * (100 - used_percent) / 100)
    return {"node": {"nodeName": "n", "runtime": {"imageFs": {
        "availableBytes": available, "capacityBytes": capacity, "usedBytes": capacity - available}}}}


def _gc(config: dict | None, summary, agent: dict | None, needed_refs=NEEDED, name: str = "cpu-1"):
    """gc.image_gc for one node; `config` None: configz answered 403."""
    from image_preflight.core.doctor import gc
    from image_preflight.core.image_gc.pinning import parse_needed
    from image_preflight.kube.cluster_inventory import KubeletUnread

    configs = {name: config if config is not None else KubeletUnread(403, "HTTP 403 Forbidden: nodes/proxy")}
    needed = parse_needed({"needed.txt": "\n".join(needed_refs)}) if needed_refs is not None else None
    reported = gc.by_node([agent] if agent is not None else [])
    return gc.image_gc([name], configs, {name: summary} if summary is not None else {}, reported, needed)


def _lines(found, status: str | None = None) -> list[str]:
    return [f.line() for f in found if status is None or f.status == status]


ALL_PINNED = {ref: True for ref in NEEDED}
TWO_UNPINNED = {**ALL_PINNED, NEEDED[1]: False, NEEDED[3]: False}


@pytest.mark.parametrize(("available", "capacity", "use"), [
    (151, 1000, 85),  # 100 - int(15100/1000) = 100 - 15: the integer division rounds use up
    (150, 1000, 85),
    (149, 1000, 86),
    (2000, 1000, 0),  # available above capacity is capped at it
    (0, 1000, 100),
    (None, 1000, 100),  # an absent field reads 0
])
def test_image_fs_use_is_computed_as_the_kubelets_gc_computes_it(available, capacity, use):
    """pkg/kubelet/images/image_gc_manager.go, GarbageCollect: available capped at capacity,
    `usagePercent := 100 - int(available*100/capacity)`."""
    from image_preflight.core.doctor.gc import image_fs_use

    image_fs = {"capacityBytes": capacity, **({"availableBytes": available} if available is not None else {})}
    assert image_fs_use({"node": {"runtime": {"imageFs": image_fs}}}) == use


def test_an_image_fs_of_capacity_0_or_no_image_fs_is_not_a_use():
    """GarbageCollect fails with InvalidDiskCapacity on capacity 0: no use to compare."""
    from image_preflight.core.doctor.gc import image_fs_use

    with pytest.raises(ValueError, match="capacity 0"):
        image_fs_use({"node": {"runtime": {"imageFs": {"availableBytes": 0, "capacityBytes": 0}}}})
    with pytest.raises(ValueError, match="no node.runtime.imageFs"):
        image_fs_use({"node": {}})


@pytest.mark.parametrize(("text", "seconds"), [("2m0s", 120), ("1h30m0s", 5400), ("0s", 0), ("0", 0),
                                               ("1.5h", 5400), ("300ms", 0.3), ("-1m", -60)])
def test_go_durations_as_configz_writes_them(text, seconds):
    """metav1.Duration marshals as Go's time.Duration.String(); time.ParseDuration reads it."""
    from image_preflight.core.doctor.gc import go_duration

    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "2 minutes", "1d", "m", "1h30"])
def test_what_is_not_a_go_duration_is_refused(text):
    from image_preflight.core.doctor.gc import go_duration

    with pytest.raises(ValueError):
        go_duration(text)


def test_absent_gc_settings_take_the_kubelets_defaults():
    """pkg/kubelet/apis/config/v1beta1/defaults.go, SetDefaults_KubeletConfiguration: 85, 80, 2m, 0."""
    from image_preflight.core.doctor.gc import gc_policy

    policy = gc_policy({})
    assert (policy.high, policy.low, policy.min_age, policy.max_age, policy.max_age_s) == (85, 80, "2m0s", "0s", 0)
    assert gc_policy({"imageGCHighThresholdPercent": 90, "imageMaximumGCAge": "1h0m0s"}).max_age_s == 3600
    with pytest.raises(ValueError, match="imageGCHighThresholdPercent"):
        gc_policy({"imageGCHighThresholdPercent": "85"})


def test_below_the_threshold_is_ok_with_the_settings():
    found = _gc({}, _summary(50), _agent("cpu-1", TWO_UNPINNED, {"list": "a/b", "supported": True}))
    assert _lines(found, "ok") == [
        "ok: node cpu-1: image filesystem 50% used, under the image GC threshold (imageGCHighThresholdPercent 85, "
        "imageGCLowThresholdPercent 80, imageMinimumGCAge 2m0s, imageMaximumGCAge 0s)"]


def test_near_the_threshold_is_a_problem_only_with_a_needed_image_unpinned():
    near_unpinned = _gc({}, _summary(80), _agent("cpu-1", TWO_UNPINNED))
    assert ("problem: node cpu-1: image filesystem 80% used, 5 point(s) under imageGCHighThresholdPercent 85: a "
            "long run's pulls may cross it, and the kubelet's image GC then deletes unused unpinned images, among "
            "them 2 needed image(s) not pinned (docker.io/library/rollout-b:v1, docker.io/library/rollout-d:v1); "
            "fix: enable pinning") in "\n".join(_lines(near_unpinned))
    near_pinned = _gc({}, _summary(80), _agent("cpu-1", ALL_PINNED, {"list": "a/b", "supported": True}))
    assert _lines(near_pinned, "problem") == []
    assert any(line.startswith("ok: node cpu-1: image filesystem 80% used, 5 point(s) under the image GC threshold")
               for line in _lines(near_pinned))
    # 75% is the edge of the warning band (85 - 10); 74% is below it.
    assert any("10 point(s) under imageGCHighThresholdPercent" in line
               for line in _lines(_gc({}, _summary(75), _agent("cpu-1", TWO_UNPINNED)), "problem"))
    assert not any("image filesystem" in line for line in _lines(_gc({}, _summary(74), _agent("cpu-1", TWO_UNPINNED)),
                                                                  "problem"))


@pytest.mark.parametrize("use", [85, 97])
def test_at_or_above_the_threshold_is_a_problem_even_with_every_needed_image_pinned(use):
    """GarbageCollect frees down to the low threshold once usagePercent >= HighThresholdPercent."""
    found = _gc({"imageGCHighThresholdPercent": 85, "imageGCLowThresholdPercent": 70}, _summary(use),
                _agent("cpu-1", ALL_PINNED, {"list": "a/b", "supported": True, "needed": 4, "pinned": 4}))
    (problem,) = [f for f in found if f.status == "problem"]
    assert problem.text == (f"node cpu-1: image filesystem {use}% used, at or above imageGCHighThresholdPercent 85: "
                            "the kubelet's image GC is deleting unused unpinned images there now, every 5 minutes, "
                            "down to 70%")
    assert "grow node cpu-1's image filesystem" in problem.fix
    unpinned = _gc({}, _summary(use), _agent("cpu-1", TWO_UNPINNED, {"list": "a/b", "supported": True}))
    at = [f for f in unpinned if "at or above" in f.text]
    assert at[0].text.endswith("among them 2 needed image(s) not pinned (docker.io/library/rollout-b:v1, "
                               "docker.io/library/rollout-d:v1)")
    assert at[0].fix == "kubectl -n image-preflight-agent logs ds/image-preflight-agent"


def test_gc_turned_off_is_ok_whatever_the_disk_use():
    """pkg/kubelet/kubelet.go, StartGarbageCollection: high 100 and no maximum age: no image GC."""
    found = _gc({"imageGCHighThresholdPercent": 100}, _summary(100), _agent("cpu-1", ALL_PINNED))
    assert _lines(found, "problem") == []
    assert any("the kubelet's image GC is off" in line for line in _lines(found, "ok"))


def test_a_maximum_age_is_a_problem_where_needed_images_are_not_pinned():
    """image_gc_manager.go, freeOldImages: images unused for longer than MaxAge go, whatever the disk use."""
    config = {"imageMaximumGCAge": "1h0m0s"}
    unpinned = _gc(config, _summary(10), _agent("cpu-1", TWO_UNPINNED))
    assert ("problem: node cpu-1: imageMaximumGCAge 1h0m0s: the kubelet deletes images unused for longer than that, "
            "whatever the disk use, among them 2 needed image(s) not pinned (docker.io/library/rollout-b:v1, "
            "docker.io/library/rollout-d:v1); fix: enable pinning") in "\n".join(_lines(unpinned))
    pinned = _gc(config, _summary(10), _agent("cpu-1", ALL_PINNED, {"list": "a/b", "supported": True}))
    assert _lines(pinned, "problem") == []
    assert ("ok: node cpu-1: imageMaximumGCAge 1h0m0s: the kubelet deletes images unused for longer than that, "
            "whatever the disk use; the needed images there are pinned") in _lines(pinned)
    assert not any("imageMaximumGCAge 0s:" in line for line in _lines(_gc({}, _summary(10), _agent("cpu-1", {}))))


def test_needed_images_not_pinned_are_named_with_the_fix_for_how_the_agent_runs():
    """pinning.needed_unpinned over spec.images: without spec.pinning the agent does not pin."""
    many = {ref: False for ref in NEEDED}
    (line,) = _lines(_gc({}, _summary(10), _agent("cpu-1", many)), "problem")
    assert line == ("problem: node cpu-1: 4 needed image(s) not pinned (docker.io/library/rollout-a:v1, "
                    "docker.io/library/rollout-b:v1, docker.io/library/rollout-c:v1 and 1 more): pinning is not "
                    "enabled on its node agent, so the kubelet's image GC may delete them; fix: enable pinning: "
                    "helm upgrade image-preflight deploy/chart/image-preflight --namespace image-preflight "
                    "--reuse-values --set agent.pinning.enabled=true")
    enabled = _gc({}, _summary(10), _agent("cpu-1", TWO_UNPINNED, {"list": "image-preflight-agent/needed-images",
                                                                   "supported": True, "message": "label failed"}))
    (line,) = _lines(enabled, "problem")
    assert "2 needed image(s) not pinned" in line and "although its node agent pins (label failed)" in line
    assert line.endswith("fix: kubectl -n image-preflight-agent logs ds/image-preflight-agent")
    assert _lines(_gc({}, _summary(10), _agent("cpu-1", ALL_PINNED)), "ok")[0] == (
        "ok: node cpu-1: the 4 needed image(s) it holds are pinned")
    assert _lines(_gc({}, _summary(10), _agent("cpu-1", {})), "ok")[0] == (
        "ok: node cpu-1: holds none of the needed images")


def test_a_runtime_that_cannot_pin_is_one_problem_with_the_upgrade():
    from image_preflight.core.image_gc.pinning import pinning_refusal

    message = pinning_refusal("containerd", "1.6.20")
    assert message is not None
    found = _gc({}, _summary(10), _agent("cpu-1", TWO_UNPINNED, {"list": "image-preflight-agent/needed-images",
                                                                 "supported": False, "message": message}))
    (line,) = _lines(found, "problem")
    assert line == (f"problem: node cpu-1: its container runtime cannot pin ({message}): the kubelet's image GC may "
                    "delete any unused image there, among them 2 needed image(s) not pinned "
                    "(docker.io/library/rollout-b:v1, docker.io/library/rollout-d:v1); fix: upgrade containerd to "
                    "2.0 or later (or 1.7.10, 1.6.25 or later in their series)")
    # Without a needed list the runtime's inability is still told.
    assert len(_lines(_gc({}, _summary(10), _agent("cpu-1", {}, {"list": "a/b", "supported": False}),
                          needed_refs=None), "problem")) == 1


def test_no_needed_list_is_one_skipped_line_with_its_command_and_no_needed_image_findings():
    from image_preflight.core.doctor.gc import needed_list

    found, needed = needed_list(None)
    assert needed is None
    assert _lines(found) == [
        "skipped: no needed list (ConfigMap image-preflight-agent/needed-images does not exist): whether the "
        "kubelet's image GC may delete a needed image is not checked, and the agent pins nothing; fix: kubectl -n "
        "image-preflight-agent create configmap needed-images --from-file=needed.txt"]
    per_node = _gc({"imageMaximumGCAge": "1h0m0s"}, _summary(80), _agent("cpu-1", TWO_UNPINNED), needed_refs=None)
    assert _lines(per_node, "problem") == [] and not any("needed" in line for line in _lines(per_node))


def test_a_needed_list_with_bad_lines_is_a_problem_with_parse_needeeds_summary():
    from image_preflight.core.doctor.gc import needed_list
    from image_preflight.core.image_gc.pinning import parse_needed

    data = {"needed.txt": "docker.io/library/rollout-a:v1\nNot A Reference\n# a comment\n"}
    found, needed = needed_list(data)
    assert needed is not None and needed.keys == {"docker.io/library/rollout-a:v1"}
    summary = parse_needed(data).summary
    assert summary and "line 2" in summary
    assert [f.status for f in found] == ["ok", "problem"]
    assert found[1].text.endswith(summary) and "edit configmap needed-images" in found[1].fix


@pytest.mark.parametrize(("status", "why", "expected"), [
    (403, "HTTP 403 Forbidden: nodes/proxy", "HTTP 403; reading it needs get on nodes/proxy"),
    (503, "HTTP 503 Service Unavailable: no route", "HTTP 503 Service Unavailable: no route: the apiserver cannot "
                                                    "reach its kubelet (node down?)"),
])
def test_an_unreadable_configz_is_one_skipped_line_per_node_naming_the_status(status, why, expected):
    from image_preflight.core.doctor import gc
    from image_preflight.kube.cluster_inventory import KubeletUnread

    configs = {"cpu-1": KubeletUnread(status, why), "cpu-2": KubeletUnread(status, why)}
    found = gc.image_gc(["cpu-1", "cpu-2"], configs, {}, {}, None)
    assert [f.status for f in found] == ["skipped", "skipped"]
    assert found[0].text == f"node cpu-1: its kubelet's image GC settings and disk use (configz: {expected})"
    assert ("nodes/proxy" in found[0].fix) is (status == 403)


def test_an_unreadable_summary_still_tells_the_settings_and_the_maximum_age():
    from image_preflight.kube.cluster_inventory import KubeletUnread

    found = _gc({"imageMaximumGCAge": "30m0s"}, KubeletUnread(404, "HTTP 404 Not Found"), _agent("cpu-1", TWO_UNPINNED))
    texts = _lines(found)
    assert ("skipped: node cpu-1: its image filesystem's use (imageGCHighThresholdPercent 85, "
            "imageGCLowThresholdPercent 80, imageMinimumGCAge 2m0s, imageMaximumGCAge 30m0s; "
            "stats/summary: HTTP 404 Not Found)") in texts
    assert any(line.startswith("problem: node cpu-1: imageMaximumGCAge 30m0s") for line in texts)


def test_the_nodes_checked_are_the_agents_and_where_rollouts_land_not_a_tainted_gpu_node():
    from image_preflight.core.doctor import gc
    from image_preflight.core.doctor.findings import eligible_nodes

    taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    nodes = [{"metadata": {"name": "cpu-1"}, "spec": {"taints": taint}}, {"metadata": {"name": "cpu-2"}},
             {"metadata": {"name": "gpu-1"}, "spec": {"taints": taint}}]
    reported = gc.by_node([_agent("cpu-1", {})])
    assert gc.gc_nodes(nodes, reported, eligible_nodes(nodes, {})) == ["cpu-1", "cpu-2"]
    # A landing node with no agent: its pins are not known, said once.
    found = gc.image_gc(["cpu-2"], {"cpu-2": {}}, {"cpu-2": _summary(80)}, reported,
                        gc.needed_list({"needed.txt": NEEDED[0]})[1])
    assert [f.status for f in found] == ["skipped", "ok"]
    assert "no node agent reports its images" in found[0].text


def test_a_fleet_of_complete_lists_is_one_line_and_each_node_to_fix_keeps_its_own():
    from image_preflight.core.doctor.findings import NODES_LISTED, node_lists, summarized

    many = NODES_LISTED + 5
    names = [f"cpu-{i:02d}" for i in range(many)]
    published = [_published(name, None) for name in names[:-1]]  # the last node's agent wrote nothing
    found = summarized(node_lists([_node(name) for name in names], published, {}, 50, now=1_000_000_010))
    lines = [f.line() for f in found]
    assert lines[0] == (f"ok: {many - 1} nodes: complete list from the node agent (1 name): "
                        f"cpu-00, cpu-01, cpu-02 and {many - 4} more"), lines
    assert len(lines) == 2 and lines[1].startswith(f"ok: node {names[-1]}: complete list in node status"), lines
    # Up to NODES_LISTED nodes, each has its line.
    few = summarized(node_lists([_node(name) for name in names[:3]], published[:3], {}, 50, now=1_000_000_010))
    assert [f.line() for f in few] == [f"ok: node {name}: complete list from the node agent (1 name)"
                                       for name in names[:3]]


def test_many_nodes_that_read_the_same_and_need_nothing_done_are_one_line_and_problems_stay_each():
    from image_preflight.core.doctor.findings import NODES_LISTED, OK, PROBLEM, SKIPPED, Finding, summarized

    many = NODES_LISTED + 1
    unread = [Finding(SKIPPED, f"node cpu-{i}: its kubelet's image GC settings (configz: HTTP 503)")
              for i in range(many)]
    broken = [Finding(PROBLEM, f"node cpu-{i}: image filesystem 90% used", "grow it") for i in range(many)]
    few = [Finding(OK, f"node gpu-{i}: holds none of the needed images") for i in range(NODES_LISTED)]
    counted = [Finding(OK, f"node big-{i}: complete list ({4_990 + i:,} names, 1 ID)") for i in range(many)]
    found = summarized([Finding(OK, "the webhook is configured"), *unread, *broken, *few, *counted])
    assert found[:2] == [Finding(OK, "the webhook is configured"), Finding(
        SKIPPED, f"{many} nodes: its kubelet's image GC settings (configz: HTTP 503): cpu-0, cpu-1, cpu-2 and "
                 f"{many - 3} more")]
    assert found[2:-1] == [*broken, *few]
    # Numbers that differ are given as their range; those all share, as they are.
    assert found[-1] == Finding(OK, f"{many} nodes: complete list (4,990-5,010 names, 1 ID): big-0, big-1, big-2 "
                                    f"and {many - 3} more")
