"""The webhook on a real control plane: deployed from the chart, called by kube-apiserver through its
Service, answered to the official client and to kr8s (agent-lightning's client), with the Job
controller and the scheduler doing the rest."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.core.decide.scheduling import NodeTraits, PodPlacement, unschedulable_reason
from image_preflight.kube.status import status_of
from tests.builders.stalls import DENIED_PREFIX, ENFORCE_LABEL, WEBHOOK, containerd_names, job_manifest
from tests.chart import AGENT_NAMESPACE, API_ONLY, apply, merged, secret_values
from tests.cluster.kube_calls import kr8s_create
from tests.controlplane.cluster import KUBELET_PORT, create_node, new_namespace, open_nodes, wait_for
from tests.controlplane.webhook import ServedWebhook

HELD = "swe-smith/task-held:openai"
HELD_ON_ONE = "swe-smith/task-partial:openai"
MISSING = "swe-smith/task-missing:openai"
NODES = ("e2e-cpu-a", "e2e-cpu-b")


@pytest.fixture(scope="module")
def nodes(control_plane):
    # The rollout nodes: untainted, like the CPU nodes agent-lightning's template lands on. Deleted
    # afterwards: any Pod without a selector would land on them in later modules.
    yield [
        create_node(control_plane, NODES[0], images=[containerd_names(HELD, "a"), containerd_names(HELD_ON_ONE, "b")],
                    taints=[]),
        create_node(control_plane, NODES[1], images=[containerd_names(HELD, "a")], taints=[]),
    ]
    for name in NODES:
        control_plane.core().delete_node(name)


@pytest.fixture(scope="module")
def webhook(control_plane, deployed, nodes, tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    kubeconfig = control_plane.service_account_kubeconfig("image-preflight", "image-preflight",
                                                          folder / "sa.kubeconfig")
    served = ServedWebhook(control_plane, deployed, kubeconfig, folder / "serve.log")
    served.start()
    # The apiserver picks the configuration up from its informer: wait until it calls us.
    namespace = new_namespace(control_plane, ENFORCE_LABEL)
    try:
        wait_for(lambda: _dry_run_denied(control_plane, namespace), "the apiserver calls the webhook", timeout_s=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nserve:\n{served.tail()}\n"
                             f"kube-apiserver:\n{control_plane.apiserver.tail()}") from None
    yield served
    served.stop()


@pytest.fixture
def enforced(control_plane, webhook) -> str:
    return new_namespace(control_plane, ENFORCE_LABEL)


def _dry_run_denied(plane, namespace: str) -> bool:
    try:
        k8s.BatchV1Api(plane.core().api_client).create_namespaced_job(
            namespace, job_manifest("probe", MISSING), dry_run="All")
    except ApiException as exc:
        return exc.status == 422
    return False


def test_the_apiserver_reaches_the_webhook_at_its_service_over_verified_tls(control_plane, webhook, enforced):
    with pytest.raises(ApiException):
        k8s.BatchV1Api(control_plane.core().api_client).create_namespaced_job(enforced, job_manifest("j", MISSING))
    # The apiserver resolved the Service to its ClusterIP itself and dialed it (once: it keeps the
    # connection); TLS succeeded with the chart's caBundle for image-preflight.image-preflight.svc.
    # (Kubelet ports are the node proxy's, for the configz other tests serve.)
    assert {a for a in control_plane.network.dialed if not a.endswith(f":{KUBELET_PORT}")} == {webhook.address}


def test_a_job_whose_image_no_node_holds_fails_at_create_with_422(control_plane, webhook, enforced):
    batch = k8s.BatchV1Api(control_plane.core().api_client)
    with pytest.raises(ApiException) as caught:
        batch.create_namespaced_job(enforced, job_manifest("rollout-missing", MISSING))
    status = status_of(caught.value)
    assert caught.value.status == 422 and status["code"] == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith(DENIED_PREFIX), status["message"]
    assert MISSING in status["message"]
    with pytest.raises(ApiException) as gone:
        batch.read_namespaced_job("rollout-missing", enforced)
    assert gone.value.status == 404


def test_a_job_whose_image_only_one_eligible_node_holds_is_denied(control_plane, webhook, enforced):
    with pytest.raises(ApiException) as caught:
        k8s.BatchV1Api(control_plane.core().api_client).create_namespaced_job(
            enforced, job_manifest("rollout-partial", HELD_ON_ONE))
    assert caught.value.status == 422
    assert NODES[1] in status_of(caught.value)["message"]


def test_kr8s_sees_the_denial_as_agent_lightning_does(control_plane, webhook, enforced):
    error = kr8s_create(control_plane, enforced, job_manifest("rollout-kr8s", MISSING))
    assert isinstance(error, str), error
    # agentlightning/controller/k8s_reconciler.py, K8sReconciler._create_job: any of these marks the
    # rollout failed at once instead of retrying.
    lower = error.lower()
    assert "422" in lower or "unprocessable" in lower or "invalid" in lower, error
    assert "invalid" in lower and MISSING in error


def test_a_held_image_runs_to_a_pod_bound_to_a_node_the_webhook_called_eligible(control_plane, webhook, enforced):
    core = control_plane.core()
    batch = k8s.BatchV1Api(core.api_client)
    batch.create_namespaced_job(enforced, job_manifest("rollout-held", HELD))
    pods = wait_for(lambda: [p for p in core.list_namespaced_pod(enforced, label_selector="job-name=rollout-held").items
                             if p.spec.node_name], "the Job's Pod is bound", timeout_s=60)
    (pod,) = pods
    # The webhook decided that Pod (not failurePolicy Ignore): its decision line names it.
    lines = [d for d in webhook.decisions() if d["kind"] == "Pod" and d["name"] == pod.metadata.name]
    assert [d["decision"] for d in lines] == ["allow"], f"{lines}; nodes a Pod may land on: {sorted(open_nodes())}"
    live_nodes = [NodeTraits.from_node(core.api_client.sanitize_for_serialization(n)) for n in core.list_node().items]
    spec = core.api_client.sanitize_for_serialization(pod.spec)
    del spec["nodeName"]  # the scheduler's binding, not part of what it was asked
    placement = PodPlacement.from_pod_spec(spec)
    eligible = {n.name for n in live_nodes if unschedulable_reason(placement, n) is None}
    assert pod.spec.node_name in eligible and eligible >= set(NODES)


def test_kr8s_creates_a_job_whose_image_is_held(control_plane, webhook, enforced):
    created = kr8s_create(control_plane, enforced, job_manifest("rollout-kr8s-held", HELD))
    assert isinstance(created, dict) and created["metadata"]["uid"], created


def test_dry_run_all_is_decided_and_nothing_is_stored(control_plane, webhook, enforced):
    batch = k8s.BatchV1Api(control_plane.core().api_client)
    with pytest.raises(ApiException) as caught:
        batch.create_namespaced_job(enforced, job_manifest("dry-missing", MISSING), dry_run="All")
    assert caught.value.status == 422
    created = batch.create_namespaced_job(enforced, job_manifest("dry-held", HELD), dry_run="All")
    assert created.metadata.name == "dry-held"
    assert batch.list_namespaced_job(enforced).items == []


def test_a_namespace_without_the_opt_in_label_is_not_checked(control_plane, webhook):
    namespace = new_namespace(control_plane)
    k8s.BatchV1Api(control_plane.core().api_client).create_namespaced_job(namespace, job_manifest("j", MISSING))
    wait_for(lambda: control_plane.core().list_namespaced_pod(namespace).items, "the Job controller creates the Pod")
    assert [d for d in webhook.decisions() if d["namespace"] == namespace] == []


def test_failure_policy_ignore_admits_while_the_webhook_is_down(control_plane, webhook, enforced):
    webhook.stop()
    try:
        created = k8s.BatchV1Api(control_plane.core().api_client).create_namespaced_job(
            enforced, job_manifest("j", MISSING))
    finally:
        webhook.start()
    assert created.metadata.uid


def test_failure_policy_fail_rejects_while_the_webhook_is_down(control_plane, webhook, deployed, enforced):
    values = merged(API_ONLY, secret_values(deployed))
    apply(control_plane, merged(values, {"webhook": {"failurePolicy": "Fail"}}))
    webhook.stop()
    batch = k8s.BatchV1Api(control_plane.core().api_client)
    try:
        def rejected() -> ApiException | None:
            try:
                batch.create_namespaced_job(enforced, job_manifest(f"j-{uuid.uuid4().hex[:6]}", HELD), dry_run="All")
            except ApiException as exc:
                return exc
            return None

        # The apiserver's informer takes the new policy within a moment.
        error = wait_for(rejected, "failurePolicy Fail is in force", timeout_s=30)
        assert error.status == 500 and f'failed calling webhook "{WEBHOOK}"' in status_of(error)["message"]
    finally:
        apply(control_plane, values)
        webhook.start()
    policy = k8s.AdmissionregistrationV1Api(control_plane.core().api_client).read_validating_webhook_configuration(
        "image-preflight").webhooks[0].failure_policy
    assert policy == "Ignore"


# --- the chart's service accounts: what they use is what they are granted ----------------------


def _granted(plane, role: str, namespace: str | None = None) -> set[tuple[str, str, str]]:
    """The ClusterRole's grants, or the Role's in `namespace`."""
    rbac = k8s.RbacAuthorizationV1Api(plane.core().api_client)
    rules = (rbac.read_namespaced_role(role, namespace) if namespace else rbac.read_cluster_role(role)).rules
    return {(g, r, v) for rule in rules for g in rule.api_groups for r in rule.resources for v in rule.verbs}


def _used(plane, kubeconfig) -> set[tuple[str, str, str]]:
    requests = plane.audited_requests(kubeconfig)
    assert [r for r in requests if r["code"] == 403] == []  # sufficient: nothing it asked was forbidden
    return {(r["group"], r["resource"] + (f"/{r['subresource']}" if r["subresource"] else ""), r["verb"])
            for r in requests}


def test_the_webhook_role_grants_exactly_what_serve_uses(control_plane, webhook):
    # Its ClusterRole, and the Role in the agents' namespace for the Leases that renew hashed lists.
    granted = _granted(control_plane, "image-preflight") | _granted(control_plane, "image-preflight-renewals",
                                                                    AGENT_NAMESPACE)
    assert ("coordination.k8s.io", "leases", "watch") in granted
    # Started, synced and answering: every request serve makes in steady state has been made.
    used = wait_for(lambda: (u := _used(control_plane, webhook.kubeconfig)) >= granted and u,
                    "serve's lists and watches", timeout_s=20)
    assert used == granted


@pytest.mark.parametrize("attempt", ["patch a node", "write a NodeImages object", "read a secret"])
def test_the_webhook_account_cannot_write_or_read_beyond_its_role(control_plane, webhook, attempt):
    api = control_plane.api_client(webhook.kubeconfig)
    calls = {
        "patch a node": lambda: k8s.CoreV1Api(api).patch_node(NODES[0], {"metadata": {"labels": {"x": "y"}}}),
        "write a NodeImages object": lambda: k8s.CustomObjectsApi(api).create_cluster_custom_object(
            "image-preflight.io", "v1alpha1", "nodeimages", {"apiVersion": "image-preflight.io/v1alpha1",
                                                             "kind": "NodeImages", "metadata": {"name": "x"}}),
        "read a secret": lambda: k8s.CoreV1Api(api).read_namespaced_secret("image-preflight-tls", "image-preflight"),
    }
    with pytest.raises(ApiException) as caught:
        calls[attempt]()
    assert caught.value.status == 403


# --- the node agent publishes, the webhook and the scanner read ---------------------------------

AGENT_NODE = "e2e-agent"
BUILT = "docker.io/swe-smith/task-built:openai"  # in the runtime, not in the node's (capped) status
ABSENT = "docker.io/swe-smith/task-absent:openai"
AGENT_GROUP = {"key": "image-preflight.test/group", "value": "agent", "effect": "NoSchedule"}


def _agent_job(name: str, image: str) -> dict:
    job = job_manifest(name, image)
    job["spec"]["template"]["spec"].update(
        nodeSelector={"kubernetes.io/hostname": AGENT_NODE},
        tolerations=[{"key": AGENT_GROUP["key"], "operator": "Exists"}])
    return job


def _dry_run(plane, namespace: str, job: dict) -> ApiException | None:
    try:
        k8s.BatchV1Api(plane.core().api_client).create_namespaced_job(namespace, job, dry_run="All")
    except ApiException as exc:
        return exc
    return None


@pytest.fixture
def agent_node(control_plane):
    # A kubelet at nodeStatusMaxImages: 50 lists 50 images; which ones, nobody can say.
    capped = [[f"docker.io/library/filler-{i}:1"] for i in range(50)]
    create_node(control_plane, AGENT_NODE, images=capped, taints=[AGENT_GROUP])
    yield AGENT_NODE
    control_plane.core().delete_node(AGENT_NODE)


def test_agent_publishes_over_cri_and_the_webhook_decides_from_the_complete_list(
        control_plane, webhook, enforced, agent_node, containerd, tmp_path):
    from tests.containerd import SANDBOX_IMAGE, build_oci_archive_many, import_image

    archive = tmp_path / "images.tar"
    # A node that runs pods holds its runtime's sandbox image; without it the node starts none.
    build_oci_archive_many(archive, [BUILT, SANDBOX_IMAGE])
    import_image(containerd.socket, archive)
    # Against the capped node status the decision is unknown: allowed, with a warning.
    assert _dry_run(control_plane, enforced, _agent_job("before", ABSENT)) is None

    kubeconfig = control_plane.service_account_kubeconfig("image-preflight-agent", "image-preflight-agent",
                                                          tmp_path / "agent.kubeconfig")
    agent = subprocess.Popen(
        [sys.executable, "-m", "image_preflight", "agent", "--publish", "--node", AGENT_NODE,
         "--cri-endpoint", containerd.endpoint, "--kubeconfig", str(kubeconfig), "--interval", "1", "--lease", "60"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb"))
    try:
        custom = k8s.CustomObjectsApi(control_plane.core().api_client)
        published = wait_for(lambda: _get_or_none(lambda: custom.get_cluster_custom_object(
            "image-preflight.io", "v1alpha1", "nodeimages", AGENT_NODE)), "the NodeImages object", timeout_s=30)
        assert any(BUILT in image.get("repoTags", []) for image in published["spec"]["images"])
        # The complete list makes the absent image missing, and the built one present.
        denied = wait_for(lambda: _dry_run(control_plane, enforced, _agent_job("after", ABSENT)),
                          "the webhook reads the published list", timeout_s=30)
        assert denied.status == 422 and ABSENT.removeprefix("docker.io/") in status_of(denied)["message"]
        assert _dry_run(control_plane, enforced, _agent_job("built", BUILT)) is None
    finally:
        agent.terminate()
        agent.wait(15)
    assert agent.returncode == 0, (tmp_path / "agent.log").read_text()
    used = _used(control_plane, kubeconfig)
    assert used and used <= _granted(control_plane, "image-preflight-agent")


def _get_or_none(call):
    try:
        return call()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_dump_and_scan_read_the_live_cluster(control_plane, webhook, tmp_path):
    from image_preflight.cli import main

    dump = tmp_path / "cluster.json"
    assert main(["inventory", "dump", "--kubeconfig", str(control_plane.kubeconfig), "--out", str(dump)]) == 0
    names = {n["metadata"]["name"] for n in json.loads(dump.read_text())["items"]}
    assert set(NODES) <= names
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"instance_id": i, "image_name": image.removesuffix(":openai"),
                                        "problem_statement": "fix it"}) + "\n"
                            for i, image in enumerate([HELD, MISSING, HELD_ON_ONE])))
    out = tmp_path / "out"
    out.mkdir()
    report = tmp_path / "report.json"
    assert main(["scan", str(rows), "--image", "{{ input.image_name }}:openai", "--inventory", str(dump),
                 "--out-dir", str(out), "--report", str(report)]) == 0
    kept = [json.loads(line)["instance_id"] for line in (out / "train.jsonl").read_text().splitlines()]
    assert kept == [0], [(d["row"], d["reason"], d.get("nodes")) for d in json.loads(report.read_text())["dropped"]]


def test_the_apiserver_adds_exactly_the_default_tolerations_the_decision_assumes(control_plane):
    """DefaultTolerationSeconds, on by default in kube-apiserver: what a Pod gains at admission is
    image_preflight.core.decide.scheduling.ADMISSION_TOLERATIONS."""
    from image_preflight.core.decide.scheduling import ADMISSION_TOLERATIONS

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": HELD}]}}
    stored = control_plane.core().create_namespaced_pod(new_namespace(control_plane), pod, dry_run="All")
    assert {(t.key, t.operator, t.effect, t.toleration_seconds) for t in stored.spec.tolerations} == {
        (t.key, t.operator, t.effect, 300) for t in ADMISSION_TOLERATIONS}


def test_the_apiserver_defaults_an_image_volume_pull_policy_as_the_decision_does(control_plane):
    """Image volumes are on by default from 1.35; the stored pullPolicy is what
    image_preflight.core.decide.workloads computes for a volume without one."""
    from image_preflight.core.decide.workloads import container_images

    spec = {"containers": [{"name": "c", "image": HELD, "volumeMounts": [
                {"name": "tagged", "mountPath": "/tagged"}, {"name": "untagged", "mountPath": "/untagged"}]}],
            "volumes": [{"name": "tagged", "image": {"reference": HELD}},
                        {"name": "untagged", "image": {"reference": "swe-smith/tools"}}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    stored = control_plane.core().create_namespaced_pod(new_namespace(control_plane), pod, dry_run="All")
    assert {v.name: v.image.pull_policy for v in stored.spec.volumes if v.image} == {
        i.container: i.pull_policy for i in container_images(spec) if i.field == "volumes"}
