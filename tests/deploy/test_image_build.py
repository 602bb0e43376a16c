"""The Dockerfile, built with no daemon and no network (tests/node/preflight_image.py): the image
deploy/'s manifests name, run as they run it, and loaded as docs/deploy.md loads it."""

from __future__ import annotations

import errno
import json
import re
import time
import tomllib
from pathlib import Path

import grpc
import pytest

from image_preflight.agent import cri_pb2
from tests.containerd import containerd2_binary, import_image, require_containerd
from tests.node.preflight_image import (
    BASE_NAME,
    NAME,
    OFFLINE,
    REPO,
    WHEELS_MOUNT,
    BuiltImage,
    archive_ref_names,
    bud_command,
    ctr_import,
    run_in_image,
    run_step,
)
from tests.release import IMAGE

# What a RUN sees of the network: its interfaces, whether the loopback is up, what a connect to an
# address off the machine gets (with a route: a reply or a timeout, not ENETUNREACH).
PROBE = """\
import errno, fcntl, socket, struct
names = sorted(name for _, name in socket.if_nameindex())
s = socket.socket()
flags = struct.unpack("16sH", fcntl.ioctl(s.fileno(), 0x8913, struct.pack("16sH", b"lo", 0))[:18])[1]
s.settimeout(5)
try:
    s.connect(("192.0.2.1", 9))
    outcome = "connected"
except OSError as exc:
    outcome = errno.errorcode.get(exc.errno, str(exc))
print(f"probe: interfaces={','.join(names)} lo={'up' if flags & 1 else 'down'} connect={outcome}")
"""


def _in_image(image: BuiltImage, *args: str) -> str:
    done = run_in_image(image, args)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
    return done.stdout


def test_user_is_numeric_non_root(preflight_image):
    """Dockerfile `USER 10001:10001`: runAsNonRoot needs a numeric uid in the image config."""
    assert preflight_image.config.get("User") == "10001:10001"


def test_entrypoint_command_and_ports(preflight_image):
    """Dockerfile ENTRYPOINT, CMD and EXPOSE: the webhook's Deployment runs the entrypoint as is."""
    config = preflight_image.config
    assert config.get("Entrypoint") == ["image-preflight", "serve"]
    assert config.get("Cmd") == ["--help"]
    assert set(config.get("ExposedPorts", {})) == {"8443/tcp", "9090/tcp"}


def test_build_arguments_stay_out_of_the_image(preflight_image):
    """Dockerfile `ARG PIP_NO_INDEX` / `ARG PIP_FIND_LINKS`: build-time only, in the build stage."""
    env = dict(item.split("=", 1) for item in preflight_image.config.get("Env", []))
    assert not [name for name in env if name.startswith("PIP_")]
    assert env["PATH"].startswith("/opt/image-preflight/bin:")


def test_the_image_has_no_pip_and_exactly_the_locked_packages(preflight_image):
    """Dockerfile: a multi-stage build; the final stage holds the virtualenv, whose every package is
    the version deploy/image/requirements.txt pins (installed --require-hashes), and no pip."""
    out = _in_image(preflight_image, "python3", "-c", (
        "import importlib.metadata as m, importlib.util, json, shutil\n"
        "print(json.dumps([importlib.util.find_spec('pip') is not None, shutil.which('pip') or shutil.which('pip3'),\n"
        "  sorted((d.metadata['Name'].lower().replace('_', '-'), d.version) for d in m.distributions(\n"
        "    path=[p for p in __import__('sys').path if p.startswith('/opt/image-preflight')]))]))\n"))
    has_pip, pip_command, installed = json.loads(out)
    assert (has_pip, pip_command) == (False, None)
    locked = _locked()
    expected = {name: version for name, version in locked.items() if name not in ("setuptools", "wheel", "pip")}
    assert dict(installed) == {**expected, "image-preflight": dict(installed)["image-preflight"]}


def _locked() -> dict[str, str]:
    return {line.split("==")[0].lower(): line.split("==")[1].split()[0]
            for line in (REPO / "deploy/image/requirements.txt").read_text().splitlines()
            if "==" in line and not line.startswith((" ", "#"))}


def test_the_base_image_is_pinned_by_digest():
    """A tag alone may point at other bytes tomorrow; a digest cannot."""
    dockerfile = (REPO / "Dockerfile").read_text()
    base = next(line for line in dockerfile.splitlines() if line.startswith("ARG BASE="))
    assert re.fullmatch(r"ARG BASE=python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base)
    assert dockerfile.count("FROM ${BASE}") == 2


def test_the_lock_pins_every_dependency_within_pyprojects_ranges():
    """deploy/image/requirements.txt, made by pip-compile from pyproject.toml: each requirement of the
    `all` extra (and the build backend) is pinned, at a version its range admits, with hashes."""
    from packaging.requirements import Requirement

    locked = _locked()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    wanted, todo = [], ["all"]
    while todo:
        for text in extras[todo.pop()]:
            requirement = Requirement(text)
            if requirement.name == "image-preflight":
                todo.extend(requirement.extras)
            else:
                wanted.append(requirement)
    wanted += [Requirement(text) for text in project["project"]["dependencies"] + project["build-system"]["requires"]]
    for requirement in wanted:
        name = requirement.name.lower().replace("_", "-")
        assert name in locked, f"{requirement} is not in the lock"
        assert requirement.specifier.contains(locked[name]), f"{name}=={locked[name]} is outside {requirement}"
    blocks = (REPO / "deploy/image/requirements.txt").read_text().split("==")[1:]
    assert all("--hash=sha256:" in block for block in blocks)


def test_archive_is_named_for_ctr(preflight_image):
    """ctr names an imported OCI image by its index's ref.name when that is a full reference."""
    assert archive_ref_names(preflight_image.archive) == [NAME]


def test_default_command_runs_as_a_pod_does(preflight_image):
    """The webhook's container as the chart's Deployment runs it (uid 10001, read-only root,
    no capabilities): ENTRYPOINT + CMD prints `serve`'s usage."""
    config = preflight_image.config
    out = _in_image(preflight_image, *config["Entrypoint"], *config["Cmd"])
    assert out.startswith("usage: image-preflight serve"), out[:500]


def test_cli_lists_every_face(preflight_image):
    """deploy/'s watchdog and agent run `command: [image-preflight]` with their subcommand."""
    out = _in_image(preflight_image, "image-preflight", "--help")
    for command in ("serve", "agent", "watchdog", "certs", "scan"):
        assert f"    {command}" in out, out


def test_container_runs_confined(preflight_image):
    """The run itself holds the Pods' constraints: uid and gid 10001, the root read-only, /tmp
    writable, no network but a loopback."""
    out = _in_image(preflight_image, "python3", "-c", (
        "import os, socket\n"
        "try:\n    open('/probe', 'w'); root = 'writable'\n"
        "except OSError as exc:\n    root = os.strerror(exc.errno)\n"
        "open('/tmp/probe', 'w').write('x')\n"
        "print(os.getuid(), os.getgid(), root, ','.join(n for _, n in socket.if_nameindex()))\n"))
    assert out.split() == ["10001", "10001", "Read-only", "file", "system", "lo"]


def _source_modules() -> set[str]:
    """Every module pyproject's setuptools config installs, by name, from the work tree."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"image_preflight": REPO / "image_preflight",
               **{name: REPO / folder for name, folder in setuptools["package-dir"].items()}}

    def folder_of(package: str) -> Path:
        parent, _, last = package.rpartition(".")
        return folders.get(package) or folder_of(parent) / last

    names = set()
    for package in setuptools["packages"]:
        for source in folder_of(package).glob("*.py"):
            names.add(package if source.stem == "__init__" else f"{package}.{source.stem}")
    return names - {"image_preflight", "image_preflight.__main__"}


def test_every_module_imports(preflight_image):
    """pyproject's `all` extra installed: every module of the package is in the image and imports
    there, and uvicorn[standard]'s httptools and uvloop are there for `serve`."""
    out = _in_image(preflight_image, "python3", "-c", (
        "import importlib, pkgutil, image_preflight\n"
        "names = [m.name for m in pkgutil.walk_packages(image_preflight.__path__, 'image_preflight.')\n"
        "         if m.name != 'image_preflight.__main__']  # runs the CLI\n"
        "for name in names + ['httptools', 'uvloop']:\n    importlib.import_module(name)\n"
        "print(' '.join(names))\n"))
    expected = _source_modules()
    assert {"image_preflight.webhook", "image_preflight.agent.cri", "image_preflight.watchdog.runner"} <= expected
    assert set(out.split()) == expected


def test_build_leaves_no_sources_or_caches(preflight_image):
    """Dockerfile `rm -rf /src` and PIP_NO_CACHE_DIR; the wheels were a RUN's mount, not a layer."""
    out = _in_image(preflight_image, "python3", "-c", (
        "import os\n"
        "print([p for p in ('/src', '/root/.cache/pip') if os.path.exists(p)], os.listdir(%r))\n" % WHEELS_MOUNT))
    assert out.strip() == "[] []"


def test_build_had_no_network(preflight_image, tmp_path):
    """Hermetic build: bud runs inside OFFLINE, and a RUN of a build made the same way finds only a
    loopback, down, and no route off the machine."""
    assert preflight_image.command[: len(OFFLINE)] == OFFLINE
    assert "--pull=never" in preflight_image.command
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "Containerfile").write_text(f"FROM {BASE_NAME}\nCOPY probe.py /probe.py\nRUN python3 /probe.py\n")
    workdir = preflight_image.workdir
    out = run_step(bud_command(workdir, tmp_path, tmp_path / "Containerfile"), "buildah bud of the probe", workdir)
    lines = [line for line in out.splitlines() if line.startswith("probe: ")]
    assert lines == [f"probe: interfaces=lo lo=down connect={errno.errorcode[errno.ENETUNREACH]}"], out[-2000:]


@pytest.mark.parametrize("runtime", ["debian", "2.x"])
def test_ctr_import_names_the_image(preflight_image, runtime):
    """docs/deploy.md: `ctr -n k8s.io images import FILE` on a node; Debian's containerd 1.6 and the
    real node's 2.x (tests/controlplane/build) both list it as the Pods' image."""
    if runtime == "debian":
        require_containerd()
    version, names = ctr_import(preflight_image.archive, None if runtime == "debian" else containerd2_binary())
    # Beside its name, CRI lists the image by its ID, as on a node.
    assert [name for name in names if not name.startswith("sha256:")] == [NAME], f"containerd {version}: {names}"


def test_kubelet_finds_it_by_the_manifests_name(preflight_image, containerd):
    """`image: image-preflight:<version>` with IfNotPresent: the kubelet asks CRI ImageStatus for the
    name as written, and the runtime normalizes it to the imported image."""
    import_image(containerd.endpoint, preflight_image.archive, unpack=False)
    with grpc.insecure_channel(containerd.endpoint) as channel:
        # The agent's stubs carry ListImages only. ImageStatusRequest is {1: ImageSpec}, ImageFilter's
        # wire form; ImageStatusResponse's {1: Image} reads as a ListImagesResponse of one image.
        image_status = channel.unary_unary(
            "/runtime.v1.ImageService/ImageStatus",
            request_serializer=lambda spec: cri_pb2.ImageFilter(image=spec).SerializeToString(),
            response_deserializer=cri_pb2.ListImagesResponse.FromString)
        # The CRI plugin learns of an import from containerd's event stream, after `ctr` returns
        # (pkg/cri/server/events.go, handleEvent of an ImageCreate): the kubelet asks again too.
        deadline = time.monotonic() + 10
        while not (found := image_status(cri_pb2.ImageSpec(image=IMAGE), timeout=10).images):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        absent = image_status(cri_pb2.ImageSpec(image="image-preflight:0.0.0"), timeout=10).images
    assert [(image.id, NAME in image.repo_tags) for image in found] == [(preflight_image.image_id, True)]
    assert list(absent) == []  # the probe tells a missing image apart


def test_host_container_state_untouched(preflight_image):
    """Private storage: nothing under /var/lib/containers (buildah's and podman's default state,
    and buildah 1.28's blob-info cache whatever --root says) changed since the build began; run
    last, so that the probe build and the containers of the other tests count too."""
    state = Path("/var/lib/containers")
    changed = [str(p) for p in (state, *state.rglob("*"))
               if p.exists() and p.lstat().st_mtime >= preflight_image.started]
    assert changed == []
