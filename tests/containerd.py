"""A private containerd for tests, and OCI image archives built without a registry.

Needs the `containerd` and `ctr` binaries and root. Everything containerd writes
(root, state, socket, log) stays in one temporary directory.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from image_preflight.agent import cri_pb2, cri_pb2_grpc
from tests.needs import unavailable

NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin serves
# The runtime's sandbox image: absent until a test imports it, as on a node that lost it.
SANDBOX_IMAGE = "localhost/image-preflight/pause:never-pulled"
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
POLL_INTERVAL_S = 0.05

_CONFIG = """\
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

# The resolver logs each host it asks at debug: close() fails on any but the stub.
[debug]
  level = "debug"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{opt}"
  [plugins."io.containerd.grpc.v1.cri"]
    # Only pulled when a pod sandbox starts, which these tests never do.
    sandbox_image = "{sandbox}"
    disable_apparmor = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{cni_bin}"
      conf_dir = "{cni_conf}"
    # Nothing here pulls; should anything try, every registry host is a closed loopback port.
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "{hosts}"
"""

# containerd 2.x reads config version 3, with the CRI plugin split in three.
_CONFIG_V3 = """\
version = 3
root = "{root}"
state = "{state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

# The resolver logs each host it asks at debug: close() fails on any but the stub.
[debug]
  level = "debug"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{sandbox}"
# Nothing here pulls; should anything try, every registry host is a closed loopback port.
[plugins."io.containerd.cri.v1.images".registry]
  config_path = "{hosts}"
[plugins."io.containerd.cri.v1.runtime"]
  disable_apparmor = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

# Snapshotters that need extra kernel or disk support; they only add noise to the log.
_UNUSED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
)
_CRI_PLUGIN = "io.containerd.grpc.v1.cri"
STUB_REGISTRY = "127.0.0.1:1"  # every registry host: a closed loopback port

# containerd's resolver logs `host=` and `url=` at debug for each request it makes
# (core/remotes/docker/resolver.go); Go's resolver and dialer errors read "lookup X on Y" and
# "dial tcp X".
_HOST_FIELD = re.compile(r'\b(?:host|url)="?(?:https?://)?([^/"\s]+)')
_NETWORK_ERROR = re.compile(r"\blookup [^ ]+ on |\bdial tcp ")


def write_hosts_toml(certs_d: Path, host: str, server: str, *, ca: Path | None = None,
                     skip_verify: bool = False) -> None:
    """containerd's `certs.d/<host>/hosts.toml` (docs/hosts.md): every pull and resolve of `host`
    goes to `server` (scheme://host:port) alone, trusting `ca` when given."""
    folder = certs_d / host
    folder.mkdir(parents=True, exist_ok=True)
    trust = f'  ca = "{ca}"\n' if ca else "  skip_verify = true\n" if skip_verify else ""
    (folder / "hosts.toml").write_text(f'server = "{server}"\n\n[host."{server}"]\n'
                                       f'  capabilities = ["pull", "resolve"]\n{trust}', encoding="utf-8")


def outside_requests(log: str, stub: str, *allowed: str) -> list[str]:
    """The lines of a containerd log that reached for any address but `stub` and the `allowed`
    registries (host:port): the test's own."""
    ours = {stub, *allowed}
    found = []
    for line in log.splitlines():
        asked = ("resolving" in line or "request" in line or "fetch" in line) and any(
            host not in ours for host in _HOST_FIELD.findall(line))
        if asked or (_NETWORK_ERROR.search(line) and not any(host in line for host in ours)):
            found.append(line)
    return found
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class ContainerdError(Exception):
    pass


class Containerd:
    """One containerd process with its own root, state and socket.

    `cri=False` disables the CRI plugin, giving a runtime without CRI v1. `base_dir`
    holds the temporary directory (default: the system temp dir); a tmpfs such as
    /dev/shm makes bulk imports several times faster, as containerd syncs every write.
    `binary`: a containerd 2.x (containerd2_binary()) instead of Debian's 1.6 on PATH.
    """

    def __init__(self, *, cri: bool = True, base_dir: str | None = None, binary: str | None = None) -> None:
        # A short base dir keeps the socket path under the 107-byte limit of AF_UNIX.
        self.dir = tempfile.mkdtemp(prefix="ctrd-", dir=base_dir)
        self.cri = cri
        self.socket = os.path.join(self.dir, "containerd.sock")
        self.endpoint = "unix://" + self.socket
        self.config_path = os.path.join(self.dir, "config.toml")
        self.log_path = os.path.join(self.dir, "containerd.log")
        self._proc: subprocess.Popen[bytes] | None = None
        self.binary = binary or "containerd"
        self.ctr = os.path.join(os.path.dirname(binary), "ctr") if binary else "ctr"
        if binary and not cri:
            raise ContainerdError("a containerd 2.x without CRI is not needed by any test")
        disabled = _UNUSED_PLUGINS if cri else (*_UNUSED_PLUGINS, _CRI_PLUGIN)
        with open(self.config_path, "w", encoding="utf-8") as f:
            f.write(
                (_CONFIG_V3 if binary else _CONFIG).format(
                    root=os.path.join(self.dir, "root"),
                    state=os.path.join(self.dir, "state"),
                    socket=self.socket,
                    opt=os.path.join(self.dir, "opt"),
                    cni_bin=os.path.join(self.dir, "cni", "bin"),
                    cni_conf=os.path.join(self.dir, "cni", "conf"),
                    disabled=", ".join(json.dumps(p) for p in disabled),
                    hosts=self._write_hosts(),
                    sandbox=SANDBOX_IMAGE,
                )
            )

    def _write_hosts(self) -> str:
        # `_default` for 2.x; the registries the tests' images name, for 1.6, which reads only a
        # host's own folder.
        certs_d = Path(self.dir) / "certs.d"
        for host in ("_default", "docker.io", "registry.k8s.io"):
            write_hosts_toml(certs_d, host, f"http://{STUB_REGISTRY}")
        return str(certs_d)

    def start(self) -> None:
        if self._proc is not None:
            raise ContainerdError(f"containerd in {self.dir} is already running")
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [self.binary, "--config", self.config_path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_ready()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """Stops and starts again on the same root and state, so images persist."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop and remove it; ContainerdError if it resolved or dialled anything but the
        loopback stub its registry hosts name."""
        self.stop()
        outside = self.outside_requests()
        shutil.rmtree(self.dir, ignore_errors=True)
        if outside:
            raise ContainerdError("containerd reached beyond the loopback stub:\n  " + "\n  ".join(outside[:10]))

    def outside_requests(self) -> list[str]:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as log:
                return outside_requests(log.read(), STUB_REGISTRY)
        except FileNotFoundError:
            return []

    def __enter__(self) -> Containerd:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, lines: int = 20) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def _wait_ready(self) -> None:
        # The CRI plugin loads its image list after the socket opens and refuses calls
        # until then, so readiness means a CRI call succeeds, not just a connection.
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise ContainerdError(
                    f"containerd exited with status {code} on start; log {self.log_path}:\n"
                    + self.log_tail()
                )
            if self._answers():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ContainerdError(
                    f"containerd at {self.socket} not ready within {START_DEADLINE_S:.0f} s;"
                    f" log {self.log_path}:\n" + self.log_tail()
                )
            time.sleep(POLL_INTERVAL_S)

    def _answers(self) -> bool:
        if not os.path.exists(self.socket):
            return False
        if not self.cri:
            done = subprocess.run(
                ["ctr", "-a", self.socket, "version"], capture_output=True, check=False
            )
            return done.returncode == 0
        with grpc.insecure_channel(self.endpoint) as channel:
            stub = cri_pb2_grpc.RuntimeServiceStub(channel)
            try:
                # Refused with "server is not initialized yet" until the images are loaded.
                stub.Version(cri_pb2.VersionRequest(version="v1"), timeout=1.0)
            except grpc.RpcError:
                return False
        return True


def _host_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}.get(
        machine, machine
    )


def _add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # fixed, so equal inputs give equal digests
    tar.addfile(info, io.BytesIO(data))


def _layer(content: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        _add_file(layer, "content", content)
    return buf.getvalue()


def _tag_of(name: str) -> str:
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"


def build_oci_archive_many(
    path: str | os.PathLike[str], names: Sequence[str], *, layer_bytes: bytes = b"image-preflight\n",
    layer: bytes | None = None, run: Sequence[str] = (),
) -> list[str]:
    """Writes one OCI image layout tar holding one image per name.

    The images share one layer: a file `content` holding `layer_bytes`, or `layer`, a whole
    layer tar. `run` is the images' entrypoint. Each config carries its name, so every name is
    a distinct image with its own id. Returns the ids (config digests) in order.
    """
    arch = _host_arch()
    blobs: dict[str, bytes] = {}

    def add_blob(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return digest

    if layer is None:
        layer = _layer(layer_bytes)
    layer_digest = add_blob(layer)
    ids: list[str] = []
    index_entries: list[dict[str, object]] = []
    for name in names:
        config = {
            "architecture": arch,
            "os": "linux",
            "config": {"Labels": {"image-preflight.test/name": name},
                       **({"Entrypoint": list(run)} if run else {})},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
        config_bytes = json.dumps(config, sort_keys=True).encode()
        config_digest = add_blob(config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": _MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config_bytes),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": len(layer),
                }
            ],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        index_entries.append(
            {
                "mediaType": _MANIFEST,
                "digest": add_blob(manifest_bytes),
                "size": len(manifest_bytes),
                "platform": {"architecture": arch, "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": _tag_of(name),
                },
            }
        )
        ids.append(config_digest)
    index = {"schemaVersion": 2, "manifests": index_entries}
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_file(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        for digest, data in blobs.items():
            _add_file(tar, "blobs/sha256/" + digest.removeprefix("sha256:"), data)
        _add_file(tar, "index.json", json.dumps(index, sort_keys=True).encode())
    return ids


def build_oci_archive(
    path: str | os.PathLike[str], name: str, *, layer_bytes: bytes = b"image-preflight\n"
) -> str:
    """Writes an OCI image layout tar holding one image; returns its id (config digest)."""
    return build_oci_archive_many(path, [name], layer_bytes=layer_bytes)[0]


def _address(sock: str) -> str:
    return sock.removeprefix("unix://")


def ctr(sock: str, *args: str, client: str = "ctr") -> str:
    """Runs `ctr -a SOCK -n k8s.io ARGS...` (`client`: the ctr of the daemon's own release,
    Containerd.ctr); returns stdout, raises with stderr on failure."""
    cmd = [client, "-a", _address(sock), "-n", NAMESPACE, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ContainerdError(
            f"{' '.join(cmd[:8])}{' ...' if len(cmd) > 8 else ''} failed"
            f" ({done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout


def import_image(sock: str, archive: str | os.PathLike[str], *, unpack: bool = True, client: str = "ctr") -> None:
    """Imports every image in the archive; `unpack=False` skips creating snapshots,
    which CRI's image list does not need."""
    ctr(sock, "images", "import", *(() if unpack else ("--no-unpack",)), os.fspath(archive), client=client)


def tag(sock: str, src: str, *dsts: str) -> None:
    """Adds names for the image named `src`; one ctr call for any number of names."""
    ctr(sock, "images", "tag", src, *dsts)


def remove(sock: str, *names: str) -> None:
    ctr(sock, "images", "rm", *names)


def manifest_digest(sock: str, name: str) -> str:
    """The digest of the manifest the image `name` points to, as `ctr images ls` shows it."""
    for row in ctr(sock, "images", "ls").splitlines()[1:]:
        columns = row.split()
        if columns and columns[0] == name:
            return columns[2]
    raise ContainerdError(f"no image named {name} in namespace {NAMESPACE} at {sock}")


def containerd2_binary() -> str:
    """The containerd 2.x that tests/controlplane/build builds beside the kubelet (the real node's)."""
    kubelet = shutil.which("kubelet")
    binary = os.path.join(os.path.dirname(kubelet), "containerd", "containerd") if kubelet else None
    if binary is None or not os.access(binary, os.X_OK):
        unavailable("containerd 2.x not built (tests/controlplane/build, then its folder on PATH)")
    require_containerd()
    return binary


def require_containerd() -> None:
    """Skips the test when containerd cannot run here; fails instead when CI is set."""
    missing = [b for b in ("containerd", "ctr") if shutil.which(b) is None]
    if missing:
        reason = f"{' and '.join(missing)} not installed (apt-get install containerd)"
    elif os.geteuid() != 0:
        reason = "containerd needs root"
    else:
        return
    unavailable(reason)
