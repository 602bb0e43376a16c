"""Nodes and their images, as the kubelet, crictl and docker print them; the agents' lists."""

from __future__ import annotations

import copy
import json

from image_preflight.core.sources.runtime_lists import runtime_object

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
