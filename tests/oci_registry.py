"""distribution's registry (github.com/distribution/distribution/v3, built by
tests/controlplane/registry/build) serving TLS of a CA of the test's own on a loopback address,
or on the host side of the real node's veth: where the tests push the chart as an OCI artifact and
the image built from the Dockerfile, and pull them back, as users of a registry do.

Nothing it holds leaves the machine: it stores in a folder of the test's, and asks no one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

from tests.chart import CHART, helm_binary
from tests.controlplane.cluster import free_port, terminate, wait_for
from tests.controlplane.pki import Authority
from tests.needs import unavailable
from tests.node.preflight_image import private_paths
from tests.release import ROOT

BUILD = "tests/controlplane/registry/build"
CHART_README = CHART / "README.md"


def registry_binary() -> str:
    path = shutil.which("registry")
    if path is None:
        unavailable(f"distribution's registry not on PATH: export PATH=\"$({BUILD} | tail -n 1):$PATH\"")
    return path


class Registry:
    """`registry serve` on `address`, its certificate issued for that address by a CA in `folder`."""

    def __init__(self, folder: Path, address: str = "127.0.0.1") -> None:
        self.folder = folder
        self.address = address
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        folder.mkdir(parents=True, exist_ok=True)
        authority = Authority(folder)
        self.ca = authority.cert_path
        self.cert, self.key = authority.issue("registry", "registry", server_names=(address,))

    @property
    def host(self) -> str:
        """What an image or chart reference names the registry by."""
        return f"{self.address}:{self.port}"

    def start(self) -> Registry:
        config = self.folder / "config.yml"
        # JSON is YAML: the configuration as distribution documents it (docs/content/about/configuration.md).
        config.write_text(json.dumps({
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.folder / "storage")}},
            "http": {"addr": self.host, "tls": {"certificate": str(self.cert), "key": str(self.key)}},
        }))
        # Its tracing would otherwise export to an OTLP collector's default address.
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "none"}
        self.process = subprocess.Popen([registry_binary(), "serve", str(config)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=open(self.folder / "registry.log", "w"))
        wait_for(self._answers, "the registry answers /v2/", timeout_s=30)
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"registry exited {self.process.returncode}: "
                               f"{(self.folder / 'registry.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"https://{self.host}/v2/", timeout=2, context=self.tls()) as answer:
                return answer.status == 200
        except OSError:
            return False

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def get(self, path: str, accept: str = "") -> tuple[dict, dict]:
        """The JSON at /v2/`path`, and the answer's headers."""
        request = urllib.request.Request(f"https://{self.host}/v2/{path}", headers={"Accept": accept} if accept else {})
        with urllib.request.urlopen(request, timeout=10, context=self.tls()) as answer:
            return json.loads(answer.read()), dict(answer.headers)

    def stop(self) -> None:
        """Stopped; start() serves the same storage on the same address again."""
        terminate(self.process)
        self.process = None

    def push_archive(self, archive: Path, reference: str) -> None:
        """The one image of an OCI archive pushed as `reference` (<host>/<path>:<tag>), as
        `docker push` would: skopeo copies it, trusting this registry's CA and no one else's
        signature policy (a policy file of its own accepts the unsigned image)."""
        skopeo = shutil.which("skopeo")
        if skopeo is None:
            unavailable("skopeo is not on PATH (Debian's skopeo; .ci/run installs it)")
        certs = self.folder / "skopeo-certs"
        certs.mkdir(exist_ok=True)
        shutil.copy(self.ca, certs / "ca.crt")  # containers-certs.d(5): each *.crt a CA
        policy = self.folder / "policy.json"
        policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        # As buildah's: containers/image keeps a blob-info cache in /var/lib/containers/cache and
        # unpacks an oci-archive: in /var/tmp, so both are private to the copy.
        done = subprocess.run(["unshare", *private_paths(self.folder / "skopeo"),
                               skopeo, "--policy", str(policy), "copy", "--quiet", "--dest-cert-dir", str(certs),
                               f"oci-archive:{archive}", f"docker://{reference}"],
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"skopeo copy to {reference} exited {done.returncode}: {done.stderr}"

def readme_block(marker: str = "helm push") -> str:
    """The chart README's ```sh block holding `marker`: how it says to publish the chart."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", CHART_README.read_text(encoding="utf-8"), re.M | re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def publish_as_readme(registry: Registry, folder: Path) -> tuple[str, list[str]]:
    """The chart README's package and push lines run as printed, in bash, `$REGISTRY` this registry
    (`<host>/image-preflight`), trusted as the system's CAs are (SSL_CERT_FILE, which Go's TLS
    reads); `helm` the tests' Helm 3. The install line, parsed: what it installs and its arguments
    (with `$REGISTRY` given), for a test to run on its cluster."""
    lines = readme_block().replace("\\\n", " ").splitlines()
    install = [line for line in lines if line.startswith("helm install")]
    workspace = folder / "publish"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "deploy").symlink_to(ROOT / "deploy")  # the clone's paths, the package written here
    env = {**os.environ, "REGISTRY": f"{registry.host}/image-preflight", "SSL_CERT_FILE": str(registry.ca),
           "HOME": str(workspace), "PATH": f"{Path(helm_binary()).parent}{os.pathsep}{os.environ['PATH']}"}
    script = "set -euo pipefail\n" + "\n".join(line for line in lines if line not in install) + "\n"
    done = subprocess.run(["bash", "-c", script], cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"the chart README's publishing lines exited {done.returncode}: {done.stderr}"
    (line,) = install
    words = [word.replace("$REGISTRY", env["REGISTRY"]) for word in shlex.split(line)]
    return words[3], words[4:]  # helm install <release> <chart> ...
