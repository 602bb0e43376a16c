"""What the node agent's tests in tests/agent/ and its cluster tests in tests/cluster/ share: the
image list as the agent builds it, `agent --print` read back, and, for pinning, the names, the needed
list's ConfigMap and a containerd's image records with their labels."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from image_preflight.agent.cri import ImageClient
from image_preflight.cli import main
from image_preflight.core.image_gc.pinning import NEEDED_NAME, NEEDED_NAMESPACE
from tests.agent_cluster import ALPHA, NODE, SWE, wait_until
from tests.containerd import Containerd, build_oci_archive_many, import_image

T0 = 1_800_000_000.0  # a whole second, so observedAt round-trips exactly


def names_by_id(images: list[dict]) -> dict[str, tuple[list[str], list[str]]]:
    return {image["id"]: (image["repoTags"], image["repoDigests"]) for image in images}


def printed(capsys, endpoint: str, *extra: str) -> dict:
    assert main(["agent", "--print", "--node", NODE, "--cri-endpoint", endpoint, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def image(image_id: str, *tags: str, digests: tuple[str, ...] = (), size: int = 1000) -> dict:
    return {"id": image_id, "repoTags": sorted(tags), "repoDigests": sorted(digests), "size": size, "pinned": False}


SAMPLE = [image("sha256:" + "a" * 64, ALPHA), image("sha256:" + "b" * 64, SWE, size=2000)]


# -- pinning ------------------------------------------------------------------------------------


BETA = "docker.io/library/beta:v1"
GAMMA = "docker.io/library/gamma:v1"
SOURCE = f"{NEEDED_NAMESPACE}/{NEEDED_NAME}"


def import_images(runtime: Containerd, directory: Path, names: list[str]) -> None:
    """Imports one image per name and waits until CRI lists them all by name (unlike
    tests.agent_cluster.import_images, which returns their ids and leaves the waiting to its caller)."""
    archive = directory / f"images-{time.monotonic_ns()}.tar"
    build_oci_archive_many(archive, names)
    import_image(runtime.socket, archive)
    with ImageClient(runtime.endpoint) as cri:
        wait_until(lambda: set(names) <= {n for i in cri.list_images() for n in i.repo_tags}, "CRI lists them")


def labels_of(runtime: Containerd, name: str) -> dict[str, str]:
    rows = subprocess.run([runtime.ctr, "-a", runtime.socket, "-n", "k8s.io", "images", "ls"], capture_output=True,
                          text=True, check=True).stdout.splitlines()[1:]
    for row in rows:
        columns = row.split()
        if columns and columns[0] == name:
            return dict(label.split("=", 1) for label in columns[-1].split(",") if "=" in label)
    raise AssertionError(f"no record {name}")
