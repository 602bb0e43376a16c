"""`image-preflight watchdog` as a process, and the kubelet's part in deleting a Pod."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.controlplane.cluster import free_port, terminate, wait_for

GRACE_S = 3.0


# Generous: the point is "at once, not at the 1,800 s deadline"; benchmarks/watchdog_latency.py
# measures the real figure.
BOUND_S = GRACE_S + 30.0


class FakeKubelet:
    """What the kubelet does for a Pod being deleted: terminal status, then delete with grace 0."""

    def __init__(self, plane) -> None:
        self.core = plane.core()
        self.namespaces: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "FakeKubelet":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            for namespace in list(self.namespaces):
                try:
                    for pod in self.core.list_namespaced_pod(namespace).items:
                        if pod.metadata.deletion_timestamp is not None:
                            self._terminate(pod)
                except ApiException:
                    pass  # gone meanwhile; the next round sees

    def _terminate(self, pod) -> None:
        name, namespace = pod.metadata.name, pod.metadata.namespace
        if pod.status.phase not in ("Failed", "Succeeded"):
            statuses = [{"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0,
                         "state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}}}
                        for c in pod.spec.containers]
            self.core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Failed",
                                                                               "containerStatuses": statuses}})
        # Options in the body, which the apiserver reads instead of the query (handlers/delete.go).
        self.core.delete_namespaced_pod(name, namespace, body=k8s.V1DeleteOptions(
            grace_period_seconds=0, preconditions=k8s.V1Preconditions(uid=pod.metadata.uid)))


class Watchdog:
    """`image-preflight watchdog` as a process."""

    def __init__(self, plane, kubeconfig: Path, log: Path, *extra: str) -> None:
        self.kubeconfig, self.log = kubeconfig, log
        self.metrics_port = free_port()
        self.args = [sys.executable, "-m", "image_preflight", "watchdog", "--kubeconfig", str(kubeconfig),
                     "--grace", str(GRACE_S), "--metrics-port", str(self.metrics_port), "--host", "127.0.0.1", *extra]
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(lambda: self.metrics() is not None, "the watchdog's /metrics", timeout_s=30)

    def stop(self) -> None:
        terminate(self.popen)

    def metrics(self) -> str | None:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(f"watchdog exited with {self.popen.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as answer:
                return answer.read().decode()
        except OSError:
            return None

    def lines(self) -> list[dict]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                found.append(json.loads(line))
        return found

    def line(self, **fields) -> dict:
        """The one line with these fields, waited for: the watchdog writes it after the Event and
        the patch a test sees first, through a log buffer flushed every FLUSH_S."""
        def matching() -> list[dict]:
            return [x for x in self.lines() if all(x.get(k) == v for k, v in fields.items())]

        wait_for(matching, f"the watchdog's line with {fields}", timeout_s=10)
        (found,) = matching()
        return found

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
