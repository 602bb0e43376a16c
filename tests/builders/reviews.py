"""Workloads and AdmissionReviews, as the apiserver sends them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from image_preflight.core.admission.answers import API_VERSION

ROOT = Path(__file__).resolve().parents[2]


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
EXAMPLE_NODES = Path(__file__).resolve().parents[2] / "examples" / "swe-smith" / "nodes.json"


def missing_job_review(uid: str = "3a1e0c55-0000-4000-8000-000000000001") -> dict:
    return review(workload("Job", pod_spec(ABSENT, nodeSelector={"pool": "cpu"})), uid=uid)


def three_nodes(path: Path, image: str, holders: tuple[str, ...]) -> Path:
    nodes = [{"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
              "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                     "images": [{"names": ["docker.io/" + image] if name in holders else ["x:1"],
                                                 "sizeBytes": 1}]}}
             for name in ("a", "b", "c")]
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    return path
