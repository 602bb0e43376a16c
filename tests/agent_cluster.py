"""The node agent against the real apiserver (as its ServiceAccount) and a test containerd."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.agent.cri import ImageClient
from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION
from tests.containerd import Containerd, build_oci_archive_many, import_image
from tests.controlplane.cluster import ControlPlane

NODE = "cpu-1"


DEADLINE_S = 15.0


ALPHA = "docker.io/library/alpha:v1"


SWE = "docker.io/swebench/sweb.eval.x86_64.astropy__astropy-12907:openai"


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


@dataclass
class Cluster:
    """The real apiserver as the agent of one node of this test uses it: `api` acts as the agent's
    ServiceAccount, whose requests the audit log holds; the rest reads as admin."""

    plane: ControlPlane
    node: str
    kubeconfig: Path
    api: k8s.ApiClient

    def stored(self) -> dict | None:
        try:
            return k8s.CustomObjectsApi(self.plane.core().api_client).get_cluster_custom_object(
                GROUP, VERSION, PLURAL, self.node)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def requests(self) -> list[tuple[str, int]]:
        """The agent's requests on NodeImages objects, in order: verb and answer code."""
        return [(r["verb"], r["code"]) for r in self.plane.audited_requests(self.kubeconfig) if r["resource"] == PLURAL]

    def writes(self) -> list[str]:
        """The verbs of the agent's writes on NodeImages objects, in order, refused ones too."""
        return [verb for verb, _ in self.requests() if verb in ("create", "update", "patch")]

    def all_tags(self) -> list[str]:
        return [name for i in self.stored()["spec"]["images"] for name in i["repoTags"]]


def import_images(runtime: Containerd, directory: Path, names: list[str]) -> dict[str, str]:
    """Imports one image per name; returns {name: id}."""
    archive = directory / f"images-{len(list(directory.iterdir()))}.tar"
    ids = build_oci_archive_many(archive, names)
    import_image(runtime.socket, archive)
    return dict(zip(names, ids))


def wait_listed(runtime: Containerd, count: int) -> None:
    """Until CRI lists `count` images: it learns of imports a moment after ctr returns."""
    with ImageClient(runtime.endpoint) as client:
        wait_until(lambda: len(client.list_images()) == count, f"CRI lists {count} images")
