"""The repository's Dockerfile built as a node gets it, with no daemon and no network.

buildah (vfs storage and chroot isolation, both private to a work folder) builds the Dockerfile
inside `unshare --net`, a network namespace with only a loopback, down: the base is a local image
made from the root filesystem tests/node/image_inputs debootstrapped (standing in for
python:3.11-slim), and pip installs with no index from its wheelhouse, bind-mounted on /mnt. The
image is pushed as an OCI archive whose index names it docker.io/library/image-preflight:<version>,
the name `ctr -n k8s.io images import` gives it and a Pod's `image: image-preflight:<version>`
normalizes to. Its containers run under runc as deploy/'s Pods run them: uid and gid 10001, a
read-only root, no capabilities, an empty /tmp, a network namespace of their own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.containerd import Containerd, ctr, import_image
from tests.node.real_node import mounts_under
from tests.release import IMAGE_NAME, VERSION

REPO = Path(__file__).resolve().parents[2]
NAME = IMAGE_NAME  # what `image: image-preflight:<version>` normalizes to
BASE_NAME = "localhost/image-preflight-base:bookworm"  # image_inputs' debootstrap suite
# python:3.11-slim's own config; a root filesystem from debootstrap carries none.
BASE_CONFIG = ("--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "--env", "LANG=C.UTF-8", "--cmd", "python3")
OFFLINE = ("unshare", "--net")  # a new network namespace: a loopback, down, and no route
# buildah 1.28 writes outside --root: a blob-info cache in /var/lib/containers/cache, and an
# oci-archive: source unpacked in /var/tmp whatever $TMPDIR says. Each call gets a mount namespace
# where /var/lib is an overlay whose writes go to a tmpfs, and /var/tmp is the work folder's tmp/.
PRIVATE_PATHS = ("--mount", "sh", "-ec",
                 'mount -t tmpfs tmpfs "$1"; mkdir "$1/upper" "$1/work"\n'
                 'mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$1/upper,workdir=$1/work" /var/lib\n'
                 'mount --bind "$2" /var/tmp\n'
                 'shift 2; exec "$@"', "sh")
INPUTS_ENV = "IMAGE_PREFLIGHT_IMAGE_INPUTS"
# Where RUN finds the wheels: FHS's mount point for a temporary filesystem, already in the base, so
# no mount point is left in the image (buildah 1.28 commits the ones it creates, empty).
WHEELS_MOUNT = "/mnt"
REF_NAME = "org.opencontainers.image.ref.name"  # ctr names an imported image by this when it is a full reference
BUILD_DEADLINE_S = 900.0
STEP_DEADLINE_S = 300.0
RUN_DEADLINE_S = 120.0

class ImageBuildError(Exception):
    pass


@dataclass(frozen=True)
class BuiltImage:
    archive: Path  # the OCI archive `ctr -n k8s.io images import` takes
    name: str
    build_seconds: float  # `buildah bud` alone
    size_bytes: int  # uncompressed: the layers as a node unpacks them
    config: dict  # the OCI image config's "config": User, Entrypoint, Cmd, ExposedPorts, Env
    total_seconds: float = 0.0  # the base, bud and push
    archive_bytes: int = 0
    image_id: str = ""  # the config's digest, as CRI reports the image's id
    command: tuple[str, ...] = ()  # the bud command, as run
    workdir: Path = Path()
    started: float = 0.0  # time.time() when the build began


def missing(inputs: Path | None = None) -> str | None:
    """Why the image cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building the image needs root (buildah's vfs storage, unshare --net)"
    for tool, package in (("buildah", "buildah"), ("unshare", "util-linux"), ("runc", "runc")):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install {package})"
    if inputs is not None and not (inputs / ".complete").is_file():
        return f"{inputs} is not a complete folder of tests/node/image_inputs (run it and use the folder it prints)"
    return None


def private_paths(workdir: Path) -> list[str]:
    """The arguments of `unshare` that run the command after them with /var/lib an overlay over a
    tmpfs and /var/tmp `workdir`/tmp (PRIVATE_PATHS)."""
    var_lib, tmp = workdir / "var-lib", workdir / "tmp"
    for folder in (var_lib, tmp):
        folder.mkdir(parents=True, exist_ok=True)
    return [*PRIVATE_PATHS, str(var_lib), str(tmp)]


def _buildah(workdir: Path) -> list[str]:
    """buildah on storage of its own (vfs needs no mounts), with no network, /var/lib and /var/tmp private."""
    return [*OFFLINE, *private_paths(workdir), "buildah", "--storage-driver", "vfs",
            "--root", str(workdir / "storage"), "--runroot", str(workdir / "run")]


def _env(workdir: Path) -> dict[str, str]:
    tmp = workdir / "tmp"  # buildah stages layers in $TMPDIR (/var/tmp otherwise)
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_step(cmd: Sequence[str], what: str, workdir: Path, *, timeout: float = STEP_DEADLINE_S,
         log: Path | None = None) -> str:
    """Runs `cmd`; returns its stdout, raises one line (the last of its output) on failure."""
    try:
        done = subprocess.run(list(cmd), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env=_env(workdir), timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ImageBuildError(f"{what}: no result within {timeout:.0f} s") from None
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        where = f"; log {log}" if log is not None else ""
        raise ImageBuildError(f"{what} failed ({done.returncode}): {_last_line(done.stderr or done.stdout)}{where}")
    return done.stdout


def bud_command(workdir: Path, context: Path, dockerfile: Path, *, tag: str | None = None,
                build_args: Sequence[str] = (), volumes: Sequence[str] = ()) -> list[str]:
    """`buildah bud` with no network at all: no pull, and every RUN in a namespace with no route."""
    cmd = [*_buildah(workdir), "bud", "--isolation", "chroot", "--pull=never",
           "--iidfile", str(workdir / "iid")]
    for arg in build_args:
        cmd += ["--build-arg", arg]
    for volume in volumes:
        cmd += ["--volume", volume]
    if tag is not None:
        cmd += ["-t", tag]
    return [*cmd, "-f", str(dockerfile), str(context)]


def make_base(inputs: Path, workdir: Path) -> str:
    """BASE_NAME, a local image of the root filesystem in `inputs`."""
    buildah = _buildah(workdir)
    container = run_step([*buildah, "from", "--pull=never", "scratch"], "buildah from scratch", workdir).strip()
    try:
        run_step([*buildah, "add", container, str(inputs / "base.tar"), "/"], "buildah add base.tar", workdir)
        run_step([*buildah, "config", *BASE_CONFIG, container], "buildah config", workdir)
        run_step([*buildah, "commit", "-q", "--rm", container, BASE_NAME], f"buildah commit {BASE_NAME}", workdir)
    except BaseException:
        subprocess.run([*buildah, "rm", container], capture_output=True, env=_env(workdir), check=False)
        raise
    return BASE_NAME


def archive_ref_names(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ImageBuildError(f"{archive}: no index.json")
        index = json.load(member)
    return [m.get("annotations", {}).get(REF_NAME, "") for m in index.get("manifests", [])]


def build_image(inputs: Path, workdir: Path) -> BuiltImage:
    """Builds the repository's Dockerfile from `inputs` (tests/node/image_inputs' folder) into an
    OCI archive in `workdir`, which also holds buildah's storage."""
    if (reason := missing(inputs)) is not None:
        raise ImageBuildError(reason)
    workdir.mkdir(parents=True, exist_ok=True)
    buildah = _buildah(workdir)
    started_at = time.time()
    started = time.monotonic()
    base = make_base(inputs, workdir)
    command = bud_command(
        workdir, REPO, REPO / "Dockerfile", tag=NAME,
        build_args=(f"BASE={base}", "PIP_NO_INDEX=1", f"PIP_FIND_LINKS={WHEELS_MOUNT}"),
        volumes=(f"{inputs / 'wheels'}:{WHEELS_MOUNT}:ro",))
    bud_started = time.monotonic()
    run_step(command, "buildah bud of the Dockerfile", workdir, timeout=BUILD_DEADLINE_S, log=workdir / "bud.log")
    build_seconds = time.monotonic() - bud_started
    image_id = (workdir / "iid").read_text().strip()

    archive = workdir / f"image-preflight-{VERSION}.oci.tar"
    archive.unlink(missing_ok=True)
    run_step([*buildah, "push", "-q", NAME, f"oci-archive:{archive}:{NAME}"], "buildah push", workdir)
    total_seconds = time.monotonic() - started
    if (names := archive_ref_names(archive)) != [NAME]:
        raise ImageBuildError(f"{archive} names {names}, not [{NAME!r}]: ctr would import it under another name")

    inspected = json.loads(run_step([*buildah, "inspect", "--type", "image", NAME], "buildah inspect", workdir))
    layers = json.loads(inspected["Manifest"])["layers"]  # local storage keeps them uncompressed
    return BuiltImage(
        archive=archive, name=NAME, build_seconds=build_seconds,
        size_bytes=sum(layer["size"] for layer in layers), config=inspected["OCIv1"]["config"],
        total_seconds=total_seconds, archive_bytes=archive.stat().st_size, image_id=image_id,
        command=tuple(command), workdir=workdir, started=started_at)


def rootfs(image: BuiltImage) -> Path:
    """The root filesystem of a container of the archive's image (made once, kept until cleanup)."""
    marker = image.workdir / "rootfs-path"
    if marker.exists():
        return Path(marker.read_text())
    buildah = _buildah(image.workdir)
    container = run_step([*buildah, "from", "-q", f"oci-archive:{image.archive}"],
                     "buildah from the archive", image.workdir).strip()
    path = Path(run_step([*buildah, "mount", container], "buildah mount", image.workdir).strip())
    marker.write_text(str(path))
    return path


def run_in_image(image: BuiltImage, args: Sequence[str], *, uid: int = 10001, gid: int = 10001,
                 timeout: float = RUN_DEADLINE_S) -> subprocess.CompletedProcess[str]:
    """Runs `args` in a container of the image under runc, as deploy/'s Pods run it (runAsUser and
    runAsGroup 10001, readOnlyRootFilesystem, capabilities dropped, /tmp an emptyDir), in a network
    namespace of its own."""
    bundle = Path(tempfile.mkdtemp(prefix="bundle-", dir=image.workdir))
    run_step(["runc", "spec", "--bundle", str(bundle)], "runc spec", image.workdir)
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"] = {"path": str(rootfs(image)), "readonly": True}
    process = spec["process"]
    process.update(terminal=False, args=list(args), env=list(image.config.get("Env", [])),
                   cwd=image.config.get("WorkingDir") or "/", user={"uid": uid, "gid": gid},
                   noNewPrivileges=True)
    process["capabilities"] = {kind: [] for kind in ("bounding", "effective", "inheritable", "permitted", "ambient")}
    spec["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                           "options": ["nosuid", "nodev", "mode=1777"]})
    if {"type": "network"} not in spec["linux"]["namespaces"]:
        raise ImageBuildError("runc spec gave no network namespace of the container's own")
    (bundle / "config.json").write_text(json.dumps(spec))
    state = image.workdir / "runc"
    runc = ["runc", "--root", str(state)]
    name = bundle.name
    try:
        return subprocess.run([*runc, "run", "--bundle", str(bundle), name], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ImageBuildError(f"runc run {' '.join(args)}: no exit within {timeout:.0f} s") from None
    finally:
        # `runc run` deletes its container when the process exits; after a timeout it is still there.
        subprocess.run([*runc, "delete", "--force", name], capture_output=True, check=False)
        shutil.rmtree(bundle, ignore_errors=True)


def ctr_import(archive: Path, containerd: str | None = None) -> tuple[str, list[str]]:
    """`ctr -n k8s.io images import ARCHIVE` into a containerd of its own (tests/containerd.py;
    `containerd`: a 2.x binary, else Debian's), unpacked as on a node; returns containerd's version
    and the names it lists."""
    with Containerd(binary=containerd, base_dir="/tmp") as runtime:
        server = ctr(runtime.socket, "version", client=runtime.ctr).split("Server:", 1)[-1].split()
        version = server[server.index("Version:") + 1] if "Version:" in server else "unknown"
        import_image(runtime.socket, archive, client=runtime.ctr)
        return version, ctr(runtime.socket, "images", "ls", "-q", client=runtime.ctr).split()


def cleanup(workdir: Path) -> None:
    """Removes buildah's containers and storage from `workdir`; the archive and bud.log stay."""
    subprocess.run([*_buildah(workdir), "rm", "--all"], capture_output=True, env=_env(workdir), check=False)
    if leftover := mounts_under([str(workdir)]):
        raise ImageBuildError(f"mounts left under {workdir}: {' '.join(leftover)}")
    for part in ("storage", "run", "tmp", "var-lib", "runc", "rootfs-path", "iid"):
        path = workdir / part
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
