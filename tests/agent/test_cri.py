"""ImageClient against a real containerd with its CRI plugin."""

from __future__ import annotations

import os
import re
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Callable

import pytest

from image_preflight.agent.cri import CRIError, ImageClient, RuntimeImage, sandbox_image_from_info
from tests.containerd import (
    Containerd,
    build_oci_archive,
    build_oci_archive_many,
    import_image,
    manifest_digest,
    remove,
    require_containerd,
    tag,
)

ALPHA = "docker.io/library/alpha:v1"
SWE = "docker.io/swebench/sweb.eval.x86_64.astropy__astropy-12907:latest"
PRIVATE = "registry.example.com:5000/team/tool:2.0"
SETTLE_DEADLINE_S = 60.0  # a bound, not a measure: a loaded CI machine may be slow


def settled(
    client: ImageClient, done: Callable[[list[RuntimeImage]], bool]
) -> list[RuntimeImage]:
    """The list once `done` holds, or the last one read when the deadline passes.

    CRI learns of image changes from containerd events, a moment after ctr returns.
    """
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    images = client.list_images()
    while not done(images) and time.monotonic() < deadline:
        time.sleep(0.05)
        images = client.list_images()
    return images


def answered(client: ImageClient) -> list[RuntimeImage]:
    """The first list the client gets, retrying while the runtime is unreachable."""
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while True:
        try:
            return client.list_images()
        except CRIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def tags_by_id(images: list[RuntimeImage]) -> dict[str, list[str]]:
    return {image.id: sorted(image.repo_tags) for image in images}


def import_one(
    runtime: Containerd, directory: os.PathLike[str], name: str, *, layer_bytes: bytes = b"x\n"
) -> str:
    archive = os.path.join(directory, name.replace("/", "_").replace(":", "_") + ".tar")
    image_id = build_oci_archive(archive, name, layer_bytes=layer_bytes)
    import_image(runtime.socket, archive)
    return image_id


def test_lists_exactly_the_imported_images(containerd: Containerd, tmp_path) -> None:
    ids = {
        ALPHA: import_one(containerd, tmp_path, ALPHA),
        SWE: import_one(containerd, tmp_path, SWE, layer_bytes=os.urandom(200_000)),
        PRIVATE: import_one(containerd, tmp_path, PRIVATE),
    }
    with ImageClient(containerd.endpoint) as client:
        images = settled(client, lambda images: len(images) == 3)

    assert {i.id: (i.repo_tags, i.repo_digests) for i in images} == {
        ids[name]: ((name,), ()) for name in ids
    }
    sizes = {i.repo_tags[0]: i.size for i in images}
    assert all(size > 0 for size in sizes.values())
    assert sizes[SWE] > 200_000 > sizes[ALPHA]
    assert not any(i.pinned for i in images)


def test_bare_socket_path_is_a_unix_endpoint(containerd: Containerd, tmp_path) -> None:
    image_id = import_one(containerd, tmp_path, ALPHA)
    with ImageClient(containerd.socket) as client:
        images = settled(client, lambda images: len(images) == 1)
    assert tags_by_id(images) == {image_id: [ALPHA]}


def test_added_tag_is_listed_on_the_same_image(containerd: Containerd, tmp_path) -> None:
    image_id = import_one(containerd, tmp_path, ALPHA)
    tag(containerd.socket, ALPHA, "docker.io/library/alpha:v2")
    with ImageClient(containerd.endpoint) as client:
        images = settled(client, lambda images: sum(len(i.repo_tags) for i in images) == 2)
    assert tags_by_id(images) == {image_id: [ALPHA, "docker.io/library/alpha:v2"]}


def test_digest_reference_is_listed_as_repo_digest(containerd: Containerd, tmp_path) -> None:
    image_id = import_one(containerd, tmp_path, ALPHA)
    by_digest = "docker.io/library/alpha@" + manifest_digest(containerd.socket, ALPHA)
    tag(containerd.socket, ALPHA, by_digest)
    with ImageClient(containerd.endpoint) as client:
        images = settled(client, lambda images: any(i.repo_digests for i in images))
    assert [(i.id, i.repo_tags, i.repo_digests) for i in images] == [
        (image_id, (ALPHA,), (by_digest,))
    ]


def test_removed_name_is_gone(containerd: Containerd, tmp_path) -> None:
    alpha_id = import_one(containerd, tmp_path, ALPHA)
    tag(containerd.socket, ALPHA, "docker.io/library/alpha:v2")
    swe_id = import_one(containerd, tmp_path, SWE)
    with ImageClient(containerd.endpoint) as client:
        settled(client, lambda images: sum(len(i.repo_tags) for i in images) == 3)
        remove(containerd.socket, ALPHA)
        images = settled(client, lambda images: all(ALPHA not in i.repo_tags for i in images))
    assert tags_by_id(images) == {alpha_id: ["docker.io/library/alpha:v2"], swe_id: [SWE]}


def test_image_stays_listed_by_id_until_its_id_reference_is_removed(
    containerd: Containerd, tmp_path
) -> None:
    # CRI keeps its own "sha256:<id>" reference to every image it has seen, so removing
    # the last name leaves a nameless image that kubelet still counts.
    image_id = import_one(containerd, tmp_path, ALPHA)
    with ImageClient(containerd.endpoint) as client:
        settled(client, lambda images: len(images) == 1)
        remove(containerd.socket, ALPHA)
        nameless = settled(client, lambda images: not any(i.repo_tags for i in images))
        remove(containerd.socket, image_id)
        after = settled(client, lambda images: not images)
    assert tags_by_id(nameless) == {image_id: []}
    assert after == []


def test_restart_keeps_images_and_the_open_client_reconnects(
    containerd: Containerd, tmp_path
) -> None:
    import_one(containerd, tmp_path, ALPHA)
    import_one(containerd, tmp_path, SWE)
    with ImageClient(containerd.endpoint) as client:
        before = settled(client, lambda images: len(images) == 2)
        containerd.restart()
        # CRI answers only after it has reloaded its images, so no waiting here.
        after = client.list_images()
    assert len(before) == 2
    assert set(after) == set(before)


def test_open_client_recovers_after_failing_while_the_runtime_is_down(
    containerd: Containerd, tmp_path
) -> None:
    import_one(containerd, tmp_path, ALPHA)
    with ImageClient(containerd.endpoint) as client:
        before = settled(client, lambda images: len(images) == 1)
        containerd.stop()
        with pytest.raises(CRIError, match=re.escape(containerd.endpoint)):
            client.list_images()
        containerd.start()
        after = answered(client)
    assert after == before


def test_version_names_the_runtime(containerd: Containerd) -> None:
    with ImageClient(containerd.endpoint) as client:
        version = client.version()
    assert (version.runtime_name, version.runtime_api_version) == ("containerd", "v1")
    assert version.runtime_version


def test_sandbox_image_is_the_one_containerd_is_configured_with(containerd: Containerd) -> None:
    with ImageClient(containerd.endpoint) as client:
        assert client.sandbox_image() == "localhost/image-preflight/pause:never-pulled"


def test_runtime_without_cri_names_no_sandbox_image() -> None:
    require_containerd()
    with Containerd(cri=False) as runtime, ImageClient(runtime.endpoint) as client:
        assert client.sandbox_image() is None


@pytest.mark.parametrize(
    "info, name",
    [
        ({"config": '{"sandboxImage": "registry.k8s.io/pause:3.6", "containerd": {}}'}, "registry.k8s.io/pause:3.6"),
        # containerd 2.x's image config, should its Status ever carry it.
        ({"config": '{"pinned_images": {"sandbox": "registry.k8s.io/pause:3.10"}}'}, "registry.k8s.io/pause:3.10"),
        ({"config": '{"cni": {}, "enableSelinux": false}'}, None),  # containerd 2.0 to 2.4
        ({"config": '{"sandboxImage": ""}'}, None),
        ({"config": '{"sandboxImage": 3}'}, None),
        ({"config": "not json"}, None),
        ({"config": "[]"}, None),
        ({}, None),
    ],
)
def test_sandbox_image_is_read_from_the_runtime_config(info: dict, name: str | None) -> None:
    assert sandbox_image_from_info(info) == name


def test_runtime_without_cri_is_reported() -> None:
    require_containerd()
    with Containerd(cri=False) as runtime, ImageClient(runtime.endpoint) as client:
        with pytest.raises(CRIError, match="not implemented") as raised:
            client.list_images()
    assert runtime.endpoint in str(raised.value)


@pytest.mark.parametrize("form", ["unix://{}", "{}"])
def test_missing_socket_names_the_endpoint(tmp_path, form: str) -> None:
    path = str(tmp_path / "absent.sock")
    endpoint = form.format(path)
    with ImageClient(endpoint, timeout=5.0) as client:
        with pytest.raises(CRIError) as raised:
            client.list_images()
    message = str(raised.value)
    assert message.startswith(f"CRI endpoint {endpoint}: ")
    assert f"{path} does not exist" in message
    assert "\n" not in message


def test_refused_connection_names_the_endpoint() -> None:
    directory = tempfile.mkdtemp(prefix="cri-")  # short: AF_UNIX paths are limited
    path = os.path.join(directory, "refusing.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)  # bound but never listening: connections are refused
        with ImageClient(path, timeout=5.0) as client:
            with pytest.raises(CRIError, match=r"^CRI endpoint .*: unavailable") as raised:
                client.list_images()
    finally:
        listener.close()
        shutil.rmtree(directory)
    assert path in str(raised.value)


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:1", "containerd.sock", ""])
def test_unsupported_endpoint_is_rejected(endpoint: str) -> None:
    with pytest.raises(CRIError, match="unsupported CRI endpoint"):
        ImageClient(endpoint)


def test_closed_client_says_so(tmp_path) -> None:
    client = ImageClient(str(tmp_path / "absent.sock"))
    client.close()
    with pytest.raises(CRIError, match="client is closed"):
        client.list_images()


def test_thousand_images_are_all_listed() -> None:
    """Also prints how long one list takes over an open channel (measured, not asserted)."""
    require_containerd()
    # containerd syncs its metadata on every write; tmpfs makes the bulk import quick.
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    names = [f"docker.io/swebench/sweb.eval.x86_64.repo__{n:04d}:latest" for n in range(1000)]
    with Containerd(base_dir=base) as runtime:
        archive = os.path.join(runtime.dir, "many.tar")
        ids = build_oci_archive_many(archive, names)
        import_image(runtime.socket, archive, unpack=False)
        with ImageClient(runtime.endpoint) as client:
            images = settled(client, lambda images: len(images) == len(names))
            durations = []
            for _ in range(20):
                start = time.perf_counter()
                client.list_images()
                durations.append(time.perf_counter() - start)
    assert tags_by_id(images) == {image_id: [name] for image_id, name in zip(ids, names)}
    print(
        f"\nlist_images, {len(images)} images: median {statistics.median(durations) * 1000:.1f} ms,"
        f" min {min(durations) * 1000:.1f} ms, max {max(durations) * 1000:.1f} ms"
    )
