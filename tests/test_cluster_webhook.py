"""The webhook on a real control plane: deployed from deploy/, called by kube-apiserver through its
Service, answered to the official client and to kr8s (agent-lightning's client), with the Job
controller and the scheduler doing the rest."""

from __future__ import annotations

import asyncio
import json
import uuid

import kr8s.asyncio
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.controlplane.cluster import create_node, wait_for
from tests.controlplane.webhook import ServedWebhook
from tests.test_deploy import SELF_SIGNED, deploy_copy  # noqa: F401 - fixture
from webhook.scheduling import NodeTraits, PodPlacement, eligible_nodes

WEBHOOK = "validate.image-preflight.io"
ENFORCE_LABEL = {"image-preflight.io/enforce": "true"}
HELD = "swe-smith/task-held:openai"
HELD_ON_ONE = "swe-smith/task-partial:openai"
MISSING = "swe-smith/task-missing:openai"
NODES = ("e2e-cpu-a", "e2e-cpu-b")
DENIED_PREFIX = f'admission webhook "{WEBHOOK}" denied the request: invalid:'


def _names(image: str, hex_digit: str) -> list[str]:
    """The names a containerd node reports for a locally built image: tag and digest."""
    repository = "docker.io/" + image.rsplit(":", 1)[0]
    return ["docker.io/" + image, f"{repository}@sha256:{hex_digit * 64}"]


@pytest.fixture(scope="module")
def deployed(control_plane, deploy_copy):
    """The self-signed overlay applied for real, with certificates from `image-preflight certs`."""
    control_plane.kubectl("apply", "--server-side", "-k", str(deploy_copy / SELF_SIGNED))
    return deploy_copy / SELF_SIGNED / "certs"


@pytest.fixture(scope="module")
def nodes(control_plane):
    created = [
        create_node(control_plane, NODES[0], images=[_names(HELD, "a"), _names(HELD_ON_ONE, "b")]),
        create_node(control_plane, NODES[1], images=[_names(HELD, "a")]),
    ]
    return created


@pytest.fixture(scope="module")
def webhook(control_plane, deployed, nodes, tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    kubeconfig = control_plane.service_account_kubeconfig("image-preflight", "image-preflight",
                                                          folder / "sa.kubeconfig")
    served = ServedWebhook(control_plane, deployed, kubeconfig, folder / "serve.log")
    served.start()
    # The apiserver picks the configuration up from its informer: wait until it calls us.
    namespace = _namespace(control_plane, ENFORCE_LABEL)
    wait_for(lambda: _dry_run_denied(control_plane, namespace), "the apiserver calls the webhook", timeout_s=30)
    yield served
    served.stop()


def _namespace(plane, labels: dict | None = None) -> str:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    plane.core().create_namespace({"metadata": {"name": name, "labels": labels or {}}})
    return name


@pytest.fixture
def enforced(control_plane, webhook) -> str:
    return _namespace(control_plane, ENFORCE_LABEL)


def job_manifest(name: str, image: str, *, parallelism: int = 1) -> dict:
    """Shaped as agent-lightning's swe_smith job-template-openai.yaml renders it, after
    build_job_spec: no nodeSelector, the Pod labelled app: agl-rollout."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "agentlightning",
                                              "agentlightning/rollout-id": name}},
        "spec": {
            "backoffLimit": 0, "parallelism": parallelism, "completions": parallelism,
            "template": {
                "metadata": {"labels": {"app": "agl-rollout"}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "agent", "image": image, "imagePullPolicy": "IfNotPresent",
                    "command": ["bash", "-lc", "python /agl/agents/smith_agent.py"],
                    "env": [{"name": "AGL_TASK_INPUT", "value": "fix the bug"}],
                    "resources": {"requests": {"cpu": "50m", "memory": "1Gi"}},
                }]},
            },
        },
    }


def _dry_run_denied(plane, namespace: str) -> bool:
    try:
        k8s.BatchV1Api(plane.core().api_client).create_namespaced_job(
            namespace, job_manifest("probe", MISSING), dry_run="All")
    except ApiException as exc:
        return exc.status == 422
    return False


def _status(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_the_apiserver_reaches_the_webhook_at_its_service_over_verified_tls(control_plane, webhook, enforced):
    with pytest.raises(ApiException):
        k8s.BatchV1Api(control_plane.core().api_client).create_namespaced_job(enforced, job_manifest("j", MISSING))
    # The apiserver resolved the Service to its ClusterIP itself and dialed it (once: it keeps the
    # connection); TLS succeeded with the overlay's caBundle for image-preflight.image-preflight.svc.
    assert set(control_plane.network.dialed) == {webhook.address}


def test_a_job_whose_image_no_node_holds_fails_at_create_with_422(control_plane, webhook, enforced):
    batch = k8s.BatchV1Api(control_plane.core().api_client)
    with pytest.raises(ApiException) as caught:
        batch.create_namespaced_job(enforced, job_manifest("rollout-missing", MISSING))
    status = _status(caught.value)
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
    assert NODES[1] in _status(caught.value)["message"]


def test_kr8s_sees_the_denial_as_agent_lightning_does(control_plane, webhook, enforced):
    async def create() -> str:
        api = await kr8s.asyncio.api(kubeconfig=str(control_plane.kubeconfig))
        manifest = job_manifest("rollout-kr8s", MISSING)
        manifest["metadata"]["namespace"] = enforced
        job = await kr8s.asyncio.objects.Job(manifest, api=api)
        try:
            await job.async_create()
        except Exception as exc:  # agent-lightning catches Exception and reads str(exc)
            return str(exc)
        return ""

    error = asyncio.run(create())
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
    assert [d["decision"] for d in lines] == ["allow"], lines
    live_nodes = [NodeTraits.from_node(core.api_client.sanitize_for_serialization(n)) for n in core.list_node().items]
    spec = core.api_client.sanitize_for_serialization(pod.spec)
    del spec["nodeName"]  # the scheduler's binding, not part of what it was asked
    eligible = {n.name for n in eligible_nodes(PodPlacement.from_pod_spec(spec), live_nodes)}
    assert pod.spec.node_name in eligible and eligible >= set(NODES)


def test_kr8s_creates_a_job_whose_image_is_held(control_plane, webhook, enforced):
    async def create() -> dict:
        api = await kr8s.asyncio.api(kubeconfig=str(control_plane.kubeconfig))
        manifest = job_manifest("rollout-kr8s-held", HELD)
        manifest["metadata"]["namespace"] = enforced
        job = await kr8s.asyncio.objects.Job(manifest, api=api)
        await job.async_create()
        return job.raw

    assert asyncio.run(create())["metadata"]["uid"]


def test_dry_run_all_is_decided_and_nothing_is_stored(control_plane, webhook, enforced):
    batch = k8s.BatchV1Api(control_plane.core().api_client)
    with pytest.raises(ApiException) as caught:
        batch.create_namespaced_job(enforced, job_manifest("dry-missing", MISSING), dry_run="All")
    assert caught.value.status == 422
    created = batch.create_namespaced_job(enforced, job_manifest("dry-held", HELD), dry_run="All")
    assert created.metadata.name == "dry-held"
    assert batch.list_namespaced_job(enforced).items == []


def test_a_namespace_without_the_opt_in_label_is_not_checked(control_plane, webhook):
    namespace = _namespace(control_plane)
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


def test_the_failure_policy_fail_component_rejects_while_the_webhook_is_down(
        control_plane, webhook, deploy_copy, enforced):
    overlay = deploy_copy / "_fail-on-self-signed"
    overlay.mkdir(exist_ok=True)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [f"../{SELF_SIGNED}"], "components": ["../components/failure-policy-fail"]}))
    control_plane.kubectl("apply", "--server-side", "-k", str(overlay))
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
        assert error.status == 500 and f'failed calling webhook "{WEBHOOK}"' in _status(error)["message"]
    finally:
        control_plane.kubectl("apply", "--server-side", "-k", str(deploy_copy / SELF_SIGNED))
        webhook.start()
    policy = k8s.AdmissionregistrationV1Api(control_plane.core().api_client).read_validating_webhook_configuration(
        "image-preflight").webhooks[0].failure_policy
    assert policy == "Ignore"
