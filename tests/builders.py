"""Objects the tests build, pure and in one place: nodes and their images as the kubelet, crictl and
docker print them, inventories, pod specs, workloads and AdmissionReviews (some nested deep), the
Pods, Events and Jobs the watchdog reads, dataset rows, and the deploy/ folder's layout."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jinja2
import yaml

from image_preflight.core.admission.answers import API_VERSION
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.decide.scheduling import NodeTraits
from image_preflight.core.sources.runtime_lists import runtime_object

ROOT = Path(__file__).resolve().parents[1]


# --- nodes and their images, as the kubelet, crictl and docker print them ----------------------------


OBSERVED = 1_796_000_000.0  # 2026-11-29T...Z


def sha(char: str) -> str:
    return "sha256:" + char * 64


def status_image(repo: str, *tags: str, digest: str | None = None, size: int = 100_000_000) -> dict:
    """One `status.images` entry as the kubelet writes it: repo digests first, then tags."""
    names = ([f"{repo}@{digest}"] if digest else []) + [f"{repo}:{tag}" for tag in tags]
    return {"names": names, "sizeBytes": size}


def kube_node(
    name: str,
    images: list[dict] = (),
    *,
    labels: dict | None = None,
    taints: list[dict] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
) -> dict:
    """A Node as `kubectl get node NAME -o json` prints it (fields left out when empty, as there)."""
    spec: dict = {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"], "providerID": f"kind://docker/kind/{name}"}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "annotations": {
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "creationTimestamp": "2026-11-01T08:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                **(labels or {}),
            },
            "name": name,
            "resourceVersion": "48213",
            "uid": "8f0c7a51-6f0e-4a7e-9b0a-2f6f3c1d9e11",
        },
        "spec": spec,
        "status": {
            "addresses": [{"address": "172.18.0.3", "type": "InternalIP"}, {"address": name, "type": "Hostname"}],
            "allocatable": {"cpu": "16", "ephemeral-storage": "959786032Ki", "memory": "65563852Ki", "pods": "110"},
            "capacity": {"cpu": "16", "ephemeral-storage": "959786032Ki", "memory": "65563852Ki", "pods": "110"},
            "conditions": [
                {
                    "lastHeartbeatTime": "2026-11-29T18:59:00Z",
                    "lastTransitionTime": "2026-11-01T08:00:30Z",
                    "message": "kubelet has sufficient memory available",
                    "reason": "KubeletHasSufficientMemory",
                    "status": "False",
                    "type": "MemoryPressure",
                },
                {
                    "lastHeartbeatTime": "2026-11-29T18:59:00Z",
                    "lastTransitionTime": "2026-11-01T08:01:00Z",
                    "message": "kubelet is posting ready status" if ready else "container runtime network not ready",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "status": "True" if ready else "False",
                    "type": "Ready",
                },
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": copy.deepcopy(list(images)),
            "nodeInfo": {
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://1.7.13",
                "kernelVersion": "6.1.0-27-amd64",
                "kubeProxyVersion": "v1.30.0",
                "kubeletVersion": "v1.30.0",
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
            },
        },
    }


def library_images(*images: str) -> list[dict]:
    """`status.images` entries for Docker Hub library images ("good:openai"), as the kubelet lists them."""
    return [{"names": [f"docker.io/library/{image}"], "sizeBytes": 1000 - i} for i, image in enumerate(images)]


def node_list(*items: dict, kind: str = "List") -> str:
    """`kubectl get nodes -o json` (kind List) or the apiserver's own NodeList."""
    listing = {"apiVersion": "v1", "items": list(items), "kind": kind, "metadata": {"resourceVersion": ""}}
    return json.dumps(listing, indent=4)


def cri_image(id_: str, tags=(), digests=(), size: str = "70520324", pinned: bool = False) -> dict:
    """One `crictl images -o json` entry."""
    return {
        "id": id_,
        "repoTags": list(tags),
        "repoDigests": list(digests),
        "size": size,
        "uid": None,
        "username": "",
        "spec": None,
        "pinned": pinned,
    }


PYTHON = status_image("docker.io/library/python", "3.11", "3.11-slim", digest=sha("1"))
PAUSE = status_image("registry.k8s.io/pause", "3.9", digest=sha("2"), size=321_520)
RUNTIME_IMAGES = [
    cri_image(sha("a"), ["docker.io/library/python:3.11"], ["docker.io/library/python@" + sha("1")]),
    cri_image(sha("b"), ["docker.io/swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai"], []),
    cri_image(sha("d"), [], ["registry.example/untagged@" + sha("4")], pinned=True),
]


def runtime(node: str = "worker-1", images=RUNTIME_IMAGES, lease: int = 300, observed_at: float = OBSERVED) -> dict:
    return runtime_object(node, images, observed_at=observed_at, lease_seconds=lease)


def docker_line(repository: str, tag: str, digest: str = "<none>", image_id: str = "5ef79149e0ec") -> str:
    # docker escapes < and > in its JSON output.
    row = {
        "Containers": "N/A",
        "CreatedAt": "2026-11-20 10:00:00 +0000 UTC",
        "CreatedSince": "9 days ago",
        "Digest": digest,
        "ID": image_id,
        "Repository": repository,
        "SharedSize": "N/A",
        "Size": "2.15GB",
        "Tag": tag,
        "UniqueSize": "N/A",
        "VirtualSize": "2.146GB",
    }
    return json.dumps(row, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


# --- inventories and pod specs for the decision ------------------------------------------------------


NOW = OBSERVED  # decisions' clock: the moment the lists were observed
SWE = "swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai"


def node(name, *names, traits=True, complete=True, ids=(), labels=None, taints=(), **listed):
    """NodeImages with scheduling traits (traits=False: unknown, as for a single-node snapshot);
    `listed` is what else the list says (expires_at, observed_at, source, sandbox_missing)."""
    node_traits = NodeTraits(name, labels or {}, tuple(taints)) if traits else None
    return NodeImages.from_names(name, names, ids=ids, traits=node_traits, complete=complete, **listed)


def inv(*nodes):
    return Inventory(tuple(nodes))


def pod(*images, policy="IfNotPresent", **spec):
    """A pod spec, one container per image; an image may be (image, policy)."""
    containers = []
    for index, image in enumerate(images):
        image, pull = image if isinstance(image, tuple) else (image, policy)
        container = {"name": f"c{index}", "image": image}
        if pull:
            container["imagePullPolicy"] = pull
        containers.append(container)
    return {"restartPolicy": "Never", "containers": containers, **spec}


# --- workloads and AdmissionReviews, as the apiserver sends them -------------------------------------


HELD = "swesmith.x86_64.pallets__click.fde47b4b:openai"
ABSENT = "swesmith.x86_64.owner__repo.deadbeef:openai"


# (group, version, resource) of each kind, as request.kind / request.resource carry them.
RESOURCES = {
    "Pod": ("", "v1", "pods"),
    "PodTemplate": ("", "v1", "podtemplates"),
    "ReplicationController": ("", "v1", "replicationcontrollers"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Job": ("batch", "v1", "jobs"),
    "CronJob": ("batch", "v1", "cronjobs"),
    "Deployment": ("apps", "v1", "deployments"),
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "DaemonSet": ("apps", "v1", "daemonsets"),
    "ReplicaSet": ("apps", "v1", "replicasets"),
}


OPTIONS = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


def pod_spec(*images: str, policy: str | None = "IfNotPresent", **extra) -> dict:
    containers = []
    for index, image in enumerate(images):
        container = {"name": "rollout" if index == 0 else f"side{index}", "image": image,
                     "command": ["python", "-m", "agentlightning.runner"]}
        if policy is not None:
            container["imagePullPolicy"] = policy
        containers.append(container)
    return {"restartPolicy": "Never", "containers": containers, **extra}


def workload(kind: str, spec: dict, name: str = "rollout-7f3a") -> dict:
    """An object of `kind` around a pod spec, defaulted fields included as the apiserver sends them."""
    group, version, _ = RESOURCES[kind]
    metadata = {"name": name, "namespace": "agl", "labels": {"app.kubernetes.io/managed-by": "agentlightning"}}
    template = {"metadata": {"labels": {"app": name}}, "spec": spec}
    bodies = {
        "Pod": {"spec": spec},
        "PodTemplate": {"template": template},
        "Job": {"spec": {"backoffLimit": 0, "completions": 1, "parallelism": 1, "suspend": False,
                         "template": template}},
        "CronJob": {"spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}}},
        "ReplicationController": {"spec": {"replicas": 1, "template": template}},
    }
    body = bodies.get(kind, {"spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                                      "template": template}})
    return {"apiVersion": f"{group}/{version}" if group else version, "kind": kind, "metadata": metadata,
            **copy.deepcopy(body)}


def review(
    obj: dict | None,
    *,
    operation: str = "CREATE",
    old: dict | None = None,
    kind: str | None = None,
    group: str | None = None,
    sub_resource: str = "",
    dry_run: bool = False,
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
) -> dict:
    """An AdmissionReview as the apiserver sends it (omitempty fields left out when empty)."""
    subject = obj if obj is not None else old
    kind = kind or subject["kind"]
    default_group, version, resource = RESOURCES.get(kind, ("", "v1", kind.lower() + "s"))
    group = default_group if group is None else group
    request = {
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": subject.get("metadata", {}).get("name", ""),
        "namespace": subject.get("metadata", {}).get("namespace", ""),
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:agl:runner", "uid": "e1b3", "groups":
                     ["system:serviceaccounts", "system:serviceaccounts:agl", "system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": OPTIONS.get(operation, "CreateOptions")},
    }
    if sub_resource:
        request["subResource"] = sub_resource
        request["requestSubResource"] = sub_resource
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": request}


EXAMPLES = ROOT / "examples" / "swe-smith"
EXAMPLE_NODES = Path(__file__).resolve().parents[1] / "examples" / "swe-smith" / "nodes.json"


def missing_job_review(uid: str = "3a1e0c55-0000-4000-8000-000000000001") -> dict:
    return review(workload("Job", pod_spec(ABSENT, nodeSelector={"pool": "cpu"})), uid=uid)


def three_nodes(path: Path, image: str, holders: tuple[str, ...]) -> Path:
    nodes = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
              "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                     "images": [{"names": ["docker.io/" + image] if name in holders else ["x:1"],
                                                 "sizeBytes": 1}]}}
             for name in ("a", "b", "c")]
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    return path


# --- reviews nested deep, as a hostile client sends them ------------------------------------------


NEAR_THE_PARSER_LIMIT = 1010  # orjson refuses past 1,024; the deepest field below is 9 levels in
DEEP = "deep"  # where body() writes the nesting: as text, as no encoder goes that deep


def nested_text(depth: int) -> str:
    opening = "".join("[" if level % 2 else '{"k":' for level in reversed(range(depth)))
    return opening + '"x"' + "".join("]" if level % 2 else "}" for level in range(depth))


def deep_workload(kind: str = "Job", **changes) -> dict:
    spec = {"containers": [{"name": "c", "image": "swe/task:openai", "imagePullPolicy": "IfNotPresent"}]}
    obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
           "spec": {"template": {"spec": spec}}}
    if kind == "Pod":
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": obj["metadata"], "spec": spec}
    for path, value in changes.items():
        target = obj
        *parents, last = path.split("__")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[last] = value
    return obj


def body(obj: dict, depth: int, where: str = "") -> bytes:
    # Without request.name and request.namespace, the answer's log line reads the object's.
    group = "" if obj["kind"] == "Pod" else "batch"
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "kind": {"group": group, "version": "v1", "kind": obj["kind"]}, "operation": "CREATE",
        "object": obj}}
    if where == "request.dryRun":
        review["request"]["dryRun"] = DEEP
    return json.dumps(review).replace(json.dumps(DEEP), nested_text(depth)).encode()


# Shown in the log line or a message: answering overflows.
SHOWN = {
    "request.object.metadata.namespace": lambda kind: deep_workload(kind, metadata__namespace=DEEP),
    "request.object.metadata.name": lambda kind: deep_workload(kind, metadata__name=DEEP),
}
SHOWN_IN_JOBS = {
    "request.object.spec.template.spec.containers[0].imagePullPolicy":
        lambda kind: deep_workload(kind, spec__template__spec__containers__0__imagePullPolicy=DEEP),
}
# Read by type, not shown: answered as any malformed object is.
READ = {
    "request.object.metadata.labels": lambda kind: deep_workload(kind, metadata__labels={"a": DEEP}),
    "request.object.spec.template.spec.containers":
        lambda kind: deep_workload(kind, spec__template__spec__containers=[DEEP]),
    "request.object.spec.template.spec.containers[0].image":
        lambda kind: deep_workload(kind, spec__template__spec__containers__0__image=DEEP),
    "request.object.spec.template.spec.nodeSelector":
        lambda kind: deep_workload(kind, spec__template__spec__nodeSelector=DEEP),
    "request.object.spec.template.spec.affinity": lambda kind: deep_workload(kind, spec__template__spec__affinity=DEEP),
    "request.dryRun": lambda kind: deep_workload(kind),
}
FIELDS = {**SHOWN, **SHOWN_IN_JOBS, **READ}


# A Pod's own spec, for /mutate.
POD_FIELDS = {
    "request.object.spec.containers[0].imagePullPolicy":
        lambda kind: deep_workload(kind, spec__containers__0__imagePullPolicy=DEEP),
    "request.object.spec.containers[0].image": lambda kind: deep_workload(kind, spec__containers__0__image=DEEP),
    "request.object.spec.nodeSelector": lambda kind: deep_workload(kind, spec__nodeSelector=DEEP),
    "request.object.spec.affinity": lambda kind: deep_workload(kind, spec__affinity=DEEP),
    "request.object.spec.tolerations": lambda kind: deep_workload(kind, spec__tolerations=[DEEP]),
}


# --- Pods, Events and Jobs, as the watchdog reads them -----------------------------------------------


NS = "rollouts"
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "agl-rollout-1", "uid": "job-uid", "controller": True,
             "blockOwnerDeletion": True}


def waiting_pod(*, reason: str | None = "ErrImageNeverPull", image: str = "swe/task:openai", policy: str | None = "IfNotPresent",
        uid: str = "pod-uid", namespace: str = NS, owner: dict | None = JOB_OWNER, init: bool = False,
        **metadata) -> dict:
    container = {"name": "agent", "image": image, **({"imagePullPolicy": policy} if policy else {})}
    state = {"waiting": {"reason": reason, "message": f"kubelet says {reason}"}} if reason else {"running": {}}
    status = {"name": "agent", "image": image, "state": state}
    key = "initContainerStatuses" if init else "containerStatuses"
    return {
        "metadata": {"name": "agl-rollout-1-abcde", "namespace": namespace, "uid": uid,
                     "ownerReferences": [owner] if owner else [], **metadata},
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


# --- dataset rows and their Job templates ------------------------------------------------------------


JOB_HEAD = """apiVersion: batch/v1
kind: Job
metadata:
  name: {{ job_name }}
  labels:
    app.kubernetes.io/managed-by: agentlightning
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: rollout
        imagePullPolicy: IfNotPresent
"""


def job_template(image_line: str, extra: str = "") -> str:
    """A Job template whose only container's image is `image_line` (template text); `extra` is
    more of the Job's spec."""
    return JOB_HEAD + f"        image: {image_line}\n" + extra


# The SWE-smith rollout's Job as agent-lightning's template writes its image.
SWE_TEMPLATE = job_template('{{ (input.image_name ~ ":openai") | yaml_escape }}')


def controller_render(source: str, row: dict) -> dict:
    """What agent-lightning's controller creates for `row` (plain Environment + yaml_escape)."""
    env = jinja2.Environment()
    env.filters["yaml_escape"] = lambda v: json.dumps(str(v), ensure_ascii=True)
    (document,) = list(yaml.safe_load_all(env.from_string(source).render(input=row, job_name="job-1")))
    return document


def example_row_id() -> str:
    first = Path(__file__).resolve().parents[1] / "examples" / "swe-smith" / "train.jsonl"
    return json.loads(first.read_text(encoding="utf-8").splitlines()[0])["instance_id"]


# --- the chart's objects, as its tests read them ------------------------------------------------------


# API groups whose CRDs cannot be installed on the test control plane (no registry, no network):
# kubernetes-validate has no schema for them either, so tests/deploy/test_chart.py checks their
# objects field by field.
CERT_MANAGER = "cert-manager.io"
MONITORING = "monitoring.coreos.com"
UNINSTALLABLE_GROUPS = frozenset({CERT_MANAGER, MONITORING})


def api_group(document: dict) -> str:
    api_version = document["apiVersion"]
    return api_version.split("/")[0] if "/" in api_version else ""
