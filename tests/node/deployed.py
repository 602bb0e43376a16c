"""deploy/ installed on the real node as docs/deploy.md tells a user: the image built from the
Dockerfile and imported with ctr, certificates from `image-preflight certs`, `kubectl apply -k`
of an overlay of the user's own beside the repository, and every Pod started by the kubelet.

`INSTALL` is the docs' command list, run here one by one with the workspace's paths; a docs test
checks that docs/deploy.md shows each of them.
"""

from __future__ import annotations

import json
import shlex
import shutil
import ssl
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes.client as k8s
import pytest
import yaml
from cryptography import x509
from kubernetes.client.rest import ApiException

from image_preflight.cli import main
from tests.controlplane.cluster import DEPLOY, ControlPlane, wait_for
from tests.node.real_node import RealNode

NAMESPACE = "image-preflight"
AGENT_NAMESPACE = "image-preflight-agent"
SERVICE_NAME = "image-preflight.image-preflight.svc"
DENIED = 'admission webhook "validate.image-preflight.io" denied the request: invalid:'
ROLLOUT_TIMEOUT = "110s"  # within kubectl()'s own 120 s

# The user's overlay beside the repository (docs/deploy.md, "Everything on one cluster").
CLUSTER_OVERLAY = {
    "resources": ["../image-preflight/deploy/overlays/self-signed"],
    "components": ["../image-preflight/deploy/components/watchdog",
                   "../image-preflight/deploy/components/steer",
                   "../image-preflight/deploy/components/failure-policy-fail"],
}


def agent_overlay(socket_path: str) -> dict:
    """deploy/agent for a node whose containerd socket is not at /run/containerd/containerd.sock."""
    return {
        "resources": ["../image-preflight/deploy/agent"],
        "patches": [{"target": {"kind": "DaemonSet", "name": "image-preflight-agent"}, "patch": (
            "- op: replace\n  path: /spec/template/spec/volumes/0/hostPath/path\n"
            f"  value: {socket_path}\n")}],
    }


# docs/deploy.md's commands, in order, from the folder holding image-preflight/ and my-cluster/.
INSTALL = (
    "ctr -n k8s.io images import image-preflight.tar",
    "image-preflight certs --service image-preflight --namespace image-preflight"
    " --out-dir image-preflight/deploy/overlays/self-signed/certs",
    "kubectl apply -k my-cluster",
    "kubectl -n image-preflight rollout status deployment/image-preflight",
    "kubectl -n image-preflight rollout status deployment/image-preflight-watchdog",
    "kubectl label node real-node image-preflight.io/agent=true",
    "kubectl apply -k my-agent",
    "kubectl -n image-preflight-agent rollout status daemonset/image-preflight-agent",
)


@dataclass
class Deployed:
    node: RealNode
    workspace: Path
    image_archive: Path
    namespaces: list[str] = field(default_factory=list)

    @property
    def plane(self) -> ControlPlane:
        return self.node.plane

    @property
    def core(self) -> k8s.CoreV1Api:
        return self.plane.core()

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.plane.api_client())

    def run(self, command: str) -> str:
        """One of the docs' commands, in the workspace."""
        argv = shlex.split(command)
        if argv[0] == "kubectl":
            if argv[1:3] == ["apply", "-k"]:
                argv[3] = str(self.workspace / argv[3])
            if "rollout" in argv:
                argv.append(f"--timeout={ROLLOUT_TIMEOUT}")
            return self.plane.kubectl(*argv[1:]).stdout
        if argv[0] == "ctr":
            assert argv[1:4] == ["-n", "k8s.io", "images"], argv
            return self.node.ctr("images", argv[4], *(str(self.workspace / a) for a in argv[5:]))
        if argv[0] == "image-preflight":
            argv = [str(self.workspace / a) if a.startswith("image-preflight/") else a for a in argv]
            assert main(argv[1:]) == 0, command
            return ""
        raise AssertionError(f"no way to run {command!r}")

    def apply(self) -> None:
        self.run("kubectl apply -k my-cluster")

    def webhook_pods(self) -> list[k8s.V1Pod]:
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=image-preflight").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def service_address(self) -> str:
        return f"{self.core.read_namespaced_service('image-preflight', NAMESPACE).spec.cluster_ip}:443"

    def namespace(self) -> str:
        name = f"dp-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace({"metadata": {"name": name, "labels": {"image-preflight.io/enforce": "true"}}})
        self.core.create_namespaced_config_map(name, {"metadata": {"name": "swe-smith-agent-scripts"},
                                                      "data": {"smith_agent.py": "print('rollout')\n"}})
        self.namespaces.append(name)
        return name

    def describe(self) -> str:
        """The state of deploy/'s Pods, their last log lines and the namespaces' Events: what a
        failed install shows."""
        lines = []
        for namespace in (NAMESPACE, AGENT_NAMESPACE):
            for pod in self.core.list_namespaced_pod(namespace).items:
                states = [(c.name, c.ready, c.restart_count, c.state.waiting or c.state.terminated or "running")
                          for c in pod.status.container_statuses or ()]
                lines.append(f"{namespace}/{pod.metadata.name} {pod.status.phase} {pod.status.pod_ip} {states}")
                try:
                    log = self.core.read_namespaced_pod_log(pod.metadata.name, namespace, tail_lines=5)
                    lines += [f"    | {line}" for line in log.splitlines()]
                except ApiException as exc:
                    lines.append(f"    (no log: {exc.status})")
            for event in self.core.list_namespaced_event(namespace).items[-30:]:
                lines.append(f"  event {event.involved_object.name}: {event.reason}: {event.message}")
        return "\n".join(lines)

    def wait_rolled_out(self) -> None:
        self.plane.kubectl("-n", NAMESPACE, "rollout", "status", "deployment/image-preflight",
                           f"--timeout={ROLLOUT_TIMEOUT}")
        wait_for(lambda: len(self.webhook_pods()) == 2 and all(ready(p) for p in self.webhook_pods()),
                 "two ready webhook replicas", timeout_s=120, interval_s=0.5)


def message(error: ApiException) -> str:
    """The apiserver's Status message of a refused request."""
    try:
        return json.loads(error.body or "{}").get("message", "")
    except ValueError:
        return error.body or ""


def ready(pod: k8s.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or ()))


def served_serial(address: str) -> int:
    """The serial of the certificate served at HOST:PORT to the Service's name."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=SERVICE_NAME) as tls:
            der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


class AdmissionStream:
    """Dry-run rollout Jobs, one after another from `threads` threads, alternating an image the
    node holds (must be admitted) and one it lacks (must be denied by the webhook): a failed
    creation is any other answer to either; an unchecked one is the absent image admitted."""

    def __init__(self, deployed: Deployed, namespace: str, held_job: dict, absent_job: dict,
                 threads: int = 2) -> None:
        self.batch = k8s.BatchV1Api(deployed.plane.api_client())
        self.namespace, self.jobs = namespace, (held_job, absent_job)
        self.stop_event = threading.Event()
        self.admitted = self.denied = 0
        self.failed: list[str] = []
        self.unchecked: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> AdmissionStream:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout=30)

    @property
    def total(self) -> int:
        return self.admitted + self.denied + len(self.failed) + len(self.unchecked)

    def _loop(self, index: int) -> None:
        turn = index
        while not self.stop_event.is_set():
            absent = turn % 2 == 1
            turn += 1
            self._one(self.jobs[absent], absent)

    def _one(self, job: dict, absent: bool) -> None:
        try:
            self.batch.create_namespaced_job(self.namespace, job, dry_run="All", _request_timeout=30)
        except ApiException as exc:
            text = message(exc)
            with self._lock:
                if absent and exc.status == 422 and text.startswith(DENIED):
                    self.denied += 1
                else:
                    self.failed.append(f"{time.strftime('%H:%M:%S')} {exc.status}: {text[:300]}")
            return
        except Exception as exc:  # noqa: BLE001 - a client-side failure is a failed creation too
            with self._lock:
                self.failed.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}")
            return
        with self._lock:
            if absent:
                self.unchecked.append(time.strftime("%H:%M:%S"))
            else:
                self.admitted += 1

    def wait_count(self, count: int, timeout_s: float = 60.0) -> None:
        wait_for(lambda: self.total >= count, f"{count} creations streamed", timeout_s=timeout_s)


def clean_slate(plane: ControlPlane) -> None:
    """What earlier modules left of deploy/ on the node's plane, gone: the install starts empty."""
    admission = k8s.AdmissionregistrationV1Api(plane.api_client())
    for delete in (admission.delete_validating_webhook_configuration, admission.delete_mutating_webhook_configuration):
        try:
            delete("image-preflight")
        except ApiException as exc:
            if exc.status != 404:
                raise
    core = plane.core()
    for name in (NAMESPACE, AGENT_NAMESPACE):
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    wait_for(lambda: not {NAMESPACE, AGENT_NAMESPACE} & {n.metadata.name for n in core.list_namespace().items},
             "deploy/'s namespaces deleted", timeout_s=120, interval_s=0.5)


def write_workspace(folder: Path, socket_path: str, archive: Path) -> Path:
    workspace = folder / "workspace"
    shutil.copytree(DEPLOY, workspace / "image-preflight" / "deploy",
                    ignore=shutil.ignore_patterns("certs"))
    for name, overlay in (("my-cluster", CLUSTER_OVERLAY), ("my-agent", agent_overlay(socket_path))):
        (workspace / name).mkdir()
        (workspace / name / "kustomization.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    shutil.copy(archive, workspace / "image-preflight.tar")
    return workspace


@pytest.fixture(scope="module")
def deployed(real_node, preflight_image, tmp_path_factory) -> Iterator[Deployed]:
    plane = real_node.plane
    clean_slate(plane)
    workspace = write_workspace(tmp_path_factory.mktemp("deployed"), str(real_node.socket), preflight_image.archive)
    deployment = Deployed(real_node, workspace, preflight_image.archive)
    try:
        try:
            for command in INSTALL:
                deployment.run(command)
            deployment.wait_rolled_out()
        except Exception as exc:
            raise AssertionError(f"{exc}\n{deployment.describe()}") from None
        yield deployment
    finally:
        for name in deployment.namespaces:
            plane.core().delete_namespace(name)
        # Nothing of deploy/ stays to call or run on the node for later modules.
        clean_slate(plane)
        plane.kubectl("label", "node", real_node.name, "image-preflight.io/agent-", check=False)
