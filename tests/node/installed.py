"""The chart installed on the real node as docs/quickstart.md tells a user, every block of the page
run as printed (tests/node/quickstart.py): the image built from the Dockerfile and pushed to a
registry, the chart packaged and pushed beside it, `helm install` from `oci://` with the node's
containerd pulling the image, `helm test`, the rollouts' namespace opted in, the datasets scanned
against the cluster and the needed list written; then what the tests do with that install.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes.client as k8s
from cryptography import x509
from kubernetes.client.rest import ApiException

from tests.agent_lightning import EXAMPLE, TEMPLATE
from tests.builders.stalls import ENFORCE_LABEL
from tests.chart import AGENT_NAMESPACE, NAMESPACE, RELEASE
from tests.controlplane.cluster import NODEIMAGES_CRD, ControlPlane, create_node, new_namespace, wait_for
from tests.needs import record_figures
from tests.node import netns, quickstart
from tests.node.preflight_image import BuiltImage
from tests.node.real_node import RealNode
from tests.oci_registry import Registry
from tests.release import VERSION

TEST_NAMESPACE = "image-preflight-test"
SERVICE_NAME = "image-preflight.image-preflight.svc"
DENIED = 'admission webhook "validate.image-preflight.io" denied the request: invalid:'
GPU_NODE = "gpu-node-1"  # the page's GPU_NODE
ROLLOUTS = "rollouts"  # the page's AGL_NAMESPACE
ROLLOUT_TIMEOUT = "110s"  # within kubectl()'s own 120 s
REGISTRY_PATH = "ml-infra"  # the page's REGISTRY is <the registry's host>/<this>
# agent-lightning's examples/swe_smith files, as the page names them: the template it ships, and
# this repository's example rows in place of its datasets.
AGL_FILES = {"job-template-openai.yaml": TEMPLATE, "train_dataset_mixed.jsonl": EXAMPLE / "train.jsonl",
             "val_dataset_filtered.jsonl": EXAMPLE / "val.jsonl"}
# Stands in for agent-lightning's examples/swe_smith/run.sh, which trains on GPUs with VERL: it
# records what it was started with, for the test to submit what the controller would.
RUN_SH = """#!/bin/sh
test -s "$AGL_TRAIN_DATASET_PATH" && test -s "$AGL_VAL_DATASET_PATH"
printf '%s\n' "$1" "$AGL_TRAIN_DATASET_PATH" "$AGL_VAL_DATASET_PATH" > "$HOME/run.sh.started"
"""


@dataclass
class Installed:
    node: RealNode
    clone: Path  # the repository's clone the page runs in
    terminal: quickstart.Terminal
    registry: Registry
    namespaces: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # what each of the page's blocks printed

    @property
    def home(self) -> Path:
        return self.clone.parent

    @property
    def image(self) -> str:
        """The image the page pushed and the chart runs: what the kubelet pulled."""
        return f"{self.registry.host}/{REGISTRY_PATH}/image-preflight:{VERSION}"

    @property
    def plane(self) -> ControlPlane:
        return self.node.plane

    @property
    def core(self) -> k8s.CoreV1Api:
        return self.plane.core()

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.plane.api_client())

    def sh(self, command: str, timeout: float = 600) -> str:
        """A command in the user's terminal; its output, or AssertionError when it fails."""
        done = self.terminal.run(command, timeout=timeout)
        assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        return done.stdout

    def helm(self, *args: str) -> str:
        return self.sh(" ".join(["helm", *args, "--namespace", NAMESPACE]))

    def webhook_pods(self) -> list[k8s.V1Pod]:
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=image-preflight").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def service_address(self) -> str:
        return f"{self.core.read_namespaced_service('image-preflight', NAMESPACE).spec.cluster_ip}:443"

    def namespace(self) -> str:
        name = new_namespace(self.plane, ENFORCE_LABEL, rollout_scripts=True)
        self.namespaces.append(name)
        return name

    def describe(self) -> str:
        """The state of the chart's Pods, their last log lines and the namespaces' Events: what a
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

    def __init__(self, installed: Installed, namespace: str, held_job: dict, absent_job: dict,
                 threads: int = 2) -> None:
        self.batch = k8s.BatchV1Api(installed.plane.api_client())
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

    def wait_more(self, count: int = 20) -> None:
        """`count` more creations than so far: the stream goes on after what happened."""
        self.wait_count(self.total + count)

    def assert_every_answer_right(self, at_least: int = 20) -> None:
        """No creation failed, no absent image admitted, and more than `at_least` of each answer."""
        assert not self.failed, self.failed[:5]
        assert not self.unchecked, self.unchecked[:5]
        assert self.admitted > at_least and self.denied > at_least, (self.admitted, self.denied)


# What a chart applied without Helm (tests/chart.apply) leaves cluster-wide: Helm refuses to
# install over objects it does not own.
CLUSTER_KINDS = ("validatingwebhookconfigurations,mutatingwebhookconfigurations,validatingadmissionpolicies,"
                 "validatingadmissionpolicybindings,clusterroles,clusterrolebindings")


def clean_slate(plane: ControlPlane) -> None:
    """What earlier modules left of the chart on the node's plane, gone: the install starts empty."""
    plane.kubectl("delete", CLUSTER_KINDS, "-l", "app.kubernetes.io/part-of=image-preflight", "--ignore-not-found")
    core = plane.core()
    chart_namespaces = {NAMESPACE, AGENT_NAMESPACE, TEST_NAMESPACE, ROLLOUTS}
    for name in chart_namespaces:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    # The CRD too, with every NodeImages object: as on a cluster new to the chart, whose install
    # makes it. One applied without Helm (as tests.chart.apply does) is not Helm's to adopt.
    plane.kubectl("delete", NODEIMAGES_CRD, "--ignore-not-found")
    wait_for(lambda: not chart_namespaces & {n.metadata.name for n in core.list_namespace().items},
             "the chart's namespaces deleted", timeout_s=120, interval_s=0.5)


def held_images() -> list[str]:
    """The example rows' images the node holds before the page is run: all but those of
    examples/swe-smith/nodes.json's missing rows, so that the scan keeps some rows and drops others."""
    listed = json.loads((EXAMPLE / "nodes.json").read_text(encoding="utf-8"))
    cpu = next(n for n in listed["items"] if n["metadata"]["name"] == "cpu-node-1")
    return sorted(name for image in cpu["status"]["images"] for name in image["names"]
                  if name.endswith(":openai"))


@contextlib.contextmanager
def installing(real_node: RealNode, preflight_image: BuiltImage, folder: Path) -> Iterator[Installed]:
    """docs/quickstart.md run from its first block to the end of step 8, on the real node, with
    `preflight_image` as the page's build and the user's clone and registry in `folder`."""
    plane = real_node.plane
    clean_slate(plane)
    # The user's registry, which their nodes pull from: the host side of the node's veth.
    registry = Registry(folder / "registry", address=netns.HOST_ADDRESS).start()
    real_node.trust_registry(registry.host, registry.ca)
    clone = quickstart.workspace(folder, AGL_FILES)
    run_sh = clone.parent / quickstart.AGL_EXAMPLE / "run.sh"
    run_sh.write_text(RUN_SH)
    run_sh.chmod(0o755)
    binaries = Path(shutil.which("kubectl") or "kubectl").parent
    env = quickstart.environment(clone.parent, kubeconfig=plane.kubeconfig, containerd_socket=real_node.socket,
                                 path_first=[binaries / "containerd", Path(sys.executable).parent],
                                 trusted_ca=registry.ca)
    values = {"CRI_SOCKET": str(real_node.socket), "REGISTRY": f"{registry.host}/{REGISTRY_PATH}"}
    installation = Installed(real_node, clone, quickstart.Terminal(clone, env, values), registry)
    try:
        # The page's `docker build` and `docker push`: the same Dockerfile's build, pushed.
        registry.push_archive(preflight_image.archive, installation.image)
        # What the user's cluster holds before step 1: a GPU node (its kubelet is not here: an API
        # object, which the lifecycle controller soon marks unreachable), and the rollout images the
        # CPU node built.
        create_node(plane, GPU_NODE, taints=[])
        real_node.import_images(held_images())
        try:
            start = time.monotonic()
            installation.outputs = [installation.terminal.block(b) for b in quickstart.blocks()
                                    if b.section != "Remove it"]
            record_figures({"quickstart_s": round(time.monotonic() - start, 1)})
            installation.wait_rolled_out()
        except Exception as exc:
            raise AssertionError(f"{exc}\n{installation.describe()}") from None
        yield installation
    finally:
        for name in installation.namespaces:
            plane.core().delete_namespace(name)
        plane.kubectl("delete", "node", GPU_NODE, "--ignore-not-found")
        # Nothing of the chart stays to call or run on the node for later modules.
        subprocess.run(["helm", "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait",
                        f"--kubeconfig={plane.kubeconfig}"], capture_output=True, check=False, timeout=300)
        clean_slate(plane)
        registry.stop()
