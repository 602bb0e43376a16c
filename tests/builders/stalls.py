"""Pods, Events, Jobs and NodeImages, as the watchdog reads them."""

from __future__ import annotations

from image_preflight.core.sources.runtime_lists import runtime_object

NS = "rollouts"
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "agl-rollout-1", "uid": "job-uid", "controller": True,
             "blockOwnerDeletion": True}
# The labels the apiserver gives a Job's Pod template (pkg/registry/batch/job/strategy.go,
# generateSelector), and the selector it generates from them.
JOB_POD_LABELS = {"batch.kubernetes.io/controller-uid": "job-uid", "controller-uid": "job-uid",
                  "batch.kubernetes.io/job-name": "agl-rollout-1", "job-name": "agl-rollout-1", "app": "agl-rollout"}
JOB_SELECTOR = {"matchLabels": {"batch.kubernetes.io/controller-uid": "job-uid"}}


def waiting_pod(*, reason: str | None = "ErrImageNeverPull", image: str = "swe/task:openai",
        policy: str | None = "IfNotPresent",
        uid: str = "pod-uid", namespace: str = NS, owner: dict | None = JOB_OWNER, init: bool = False,
        labels: dict | None = JOB_POD_LABELS, **metadata) -> dict:
    container = {"name": "agent", "image": image, **({"imagePullPolicy": policy} if policy else {})}
    state = {"waiting": {"reason": reason, "message": f"kubelet says {reason}"}} if reason else {"running": {}}
    status = {"name": "agent", "image": image, "state": state}
    key = "initContainerStatuses" if init else "containerStatuses"
    return {
        "metadata": {"name": "agl-rollout-1-abcde", "namespace": namespace, "uid": uid,
                     "ownerReferences": [owner] if owner else [], **({"labels": dict(labels)} if labels else {}),
                     **metadata},
        "spec": {"nodeName": "cpu-a", ("initContainers" if init else "containers"): [container],
                 **({"containers": [{"name": "main", "image": "x:1"}]} if init else {})},
        "status": {"phase": "Pending", key: [status]},
    }


WEBHOOK = "validate.image-preflight.io"  # the chart's ValidatingWebhookConfiguration
WEBHOOKS = frozenset({WEBHOOK})


def failed_create(webhook: str = "validate.image-preflight.io", *, reason: str = "FailedCreate",
                  kind: str = "Job", uid: str = "job-uid") -> dict:
    # pkg/controller/controller_utils.go createPods: "Error creating: %v" of the apiserver's
    # error, apiserver/pkg/admission/plugin/webhook/errors/statuserror.go ToStatusErr; the Job
    # controller's recorder (client-go tools/record) names it as source and reporting component.
    return {"metadata": {"name": "agl-rollout-1.1", "namespace": NS, "uid": "event-uid"}, "reason": reason,
            "involvedObject": {"apiVersion": "batch/v1", "kind": kind, "name": "agl-rollout-1", "namespace": NS,
                               "uid": uid},
            "source": {"component": "job-controller"}, "reportingComponent": "job-controller",
            "message": f'Error creating: admission webhook "{webhook}" denied the request: invalid: image x is absent'}


# The kubelet's words (pkg/kubelet/kuberuntime/kuberuntime_manager.go, SyncPod: "Failed to create pod
# sandbox: %v" of the CRI error, "rpc error: code = <code> desc = <message>"), around containerd's:
SANDBOX_MESSAGES = {
    # 2.3: podsandbox Controller.Start, "failed to get sandbox image %q: %w" around client.GetImage's
    # "image %q: not found" (core/metadata/images.go), as when disable_pause_image_pull is set.
    "containerd 2.3 Start": 'Failed to create pod sandbox: rpc error: code = NotFound desc = failed to get sandbox '
    'image "registry.k8s.io/pause:3.10.1": image "registry.k8s.io/pause:3.10.1": not found',
    # 2.3: criService.ensurePauseImageExists, "failed to pull image %q: %w", the registry without it
    # (core/remotes/docker/resolver.go: "%s: %w" of ErrNotFound; client/pull.go "failed to resolve reference").
    "containerd 2.3 pre-pull": 'Failed to create pod sandbox: rpc error: code = NotFound desc = failed to pull image '
    '"registry.k8s.io/pause:3.10.1": failed to pull and unpack image "registry.k8s.io/pause:3.10.1": failed to '
    'resolve reference "registry.k8s.io/pause:3.10.1": registry.k8s.io/pause:3.10.1: not found',
    # 1.6 (pkg/cri/server/sandbox_run.go) to 2.2: ensureImageExists pulls, and the pull finds nothing.
    "containerd 1.6": 'Failed to create pod sandbox: rpc error: code = NotFound desc = failed to get sandbox image '
    '"registry.k8s.io/pause:3.6": failed to pull image "registry.k8s.io/pause:3.6": failed to pull and unpack image '
    '"registry.k8s.io/pause:3.6": failed to resolve reference "registry.k8s.io/pause:3.6": '
    'registry.k8s.io/pause:3.6: not found',
}


def sandbox_event(message: str = SANDBOX_MESSAGES["containerd 2.3 Start"], *, uid: str = "pod-uid",
                  reason: str = "FailedCreatePodSandBox", kind: str = "Pod") -> dict:
    """A kubelet's Event as the apiserver serves it (core/v1, the legacy recorder)."""
    return {"metadata": {"name": "agl-rollout-1-abcde.18b2f4c1", "namespace": NS, "uid": "event-uid"},
            "involvedObject": {"kind": kind, "namespace": NS, "name": "agl-rollout-1-abcde", "uid": uid,
                               "apiVersion": "v1", "resourceVersion": "812"},
            "reason": reason, "message": message, "source": {"component": "kubelet", "host": "cpu-a"},
            "reportingComponent": "kubelet", "type": "Warning", "count": 3}


SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.1"  # as SANDBOX_MESSAGES["containerd 2.3 Start"] names it


def node_images(node: str = "cpu-a", *, present: bool | None = False, image: str = SANDBOX_IMAGE,
                observed_at: float = 1_000_000.0, lease_seconds: int = 300) -> dict:
    """The node agent's NodeImages for `node`, saying whether its runtime holds `image` as its
    sandbox image (None: the runtime did not name one)."""
    sandbox = None if present is None else {"name": image, "present": present}
    return runtime_object(node, [{"id": "sha256:" + "a" * 64, "repoTags": ["docker.io/library/x:1"]}],
                          observed_at=observed_at, lease_seconds=lease_seconds, sandbox_image=sandbox)


def kubelet_event(pod, node: str, message: str, *, in_namespace: str | None = None,
                  now: str = "2026-11-30T00:00:00Z") -> dict:
    """The core/v1 Event the kubelet's legacy recorder writes for a failed RunPodSandbox of `pod`
    (a V1Pod), to create in `in_namespace` (the Pod's unless given), which it also names as the
    Pod's: legacyValidateEvent holds involvedObject.namespace to the Event's own."""
    namespace = in_namespace or pod.metadata.namespace
    return {
        "metadata": {"generateName": f"{pod.metadata.name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "namespace": namespace,
                           "uid": pod.metadata.uid},
        "reason": "FailedCreatePodSandBox", "message": message, "type": "Warning",
        "source": {"component": "kubelet", "host": node}, "reportingComponent": "kubelet",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1}


def unstarted(**changes) -> dict:
    """A bound Pod the kubelet has not got a sandbox for: its containers wait in ContainerCreating."""
    bound = waiting_pod(reason="ContainerCreating")
    bound["status"]["conditions"] = [{"type": "PodReadyToStartContainers", "status": "False"},
                                     {"type": "PodScheduled", "status": "True"}]
    for key, value in changes.items():
        bound[key] = {**bound[key], **value}
    return bound


ENFORCE_LABEL = {"image-preflight.io/enforce": "true"}
DENIED_PREFIX = f'admission webhook "{WEBHOOK}" denied the request: invalid:'


def containerd_names(image: str, hex_digit: str) -> list[str]:
    """The names a containerd node reports for a locally built image: tag and digest."""
    repository = "docker.io/" + image.rsplit(":", 1)[0]
    return ["docker.io/" + image, f"{repository}@sha256:{hex_digit * 64}"]


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


def failed_condition(job: dict) -> dict | None:
    return next((c for c in job.get("status", {}).get("conditions") or []
                 if c["type"] == "Failed" and c["status"] == "True"), None)
