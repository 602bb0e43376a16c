"""`image-preflight serve` as a process, reached by the real apiserver through its Service."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

from image_preflight.service import FLUSH_S
from tests.controlplane.cluster import ControlPlane, free_port, terminate

SERVICE = NAMESPACE = "image-preflight"  # the chart's Service, and the namespace it is installed in


class ServedWebhook:
    """`image-preflight serve --kubeconfig` with the certificates of the applied chart, exposed
    at the webhook Service's ClusterIP:443 on the cluster network. No kubeconfig: `extra` gives the
    inventory (--inventory); `service` names another Service of the chart's namespace to be reached at."""

    def __init__(self, plane: ControlPlane, certs: Path, kubeconfig: Path | None, log: Path, *extra: str,
                 service: str = SERVICE) -> None:
        self.plane, self.certs, self.kubeconfig, self.log = plane, certs, kubeconfig, log
        self.extra = extra
        self.port, self.metrics_port = free_port(), free_port()
        found = plane.core().read_namespaced_service(service, NAMESPACE)
        self.address = f"{found.spec.cluster_ip}:443"
        self.host = f"{service}.{NAMESPACE}.svc"  # the name its certificate holds, as the apiserver dials it
        self.popen: subprocess.Popen | None = None
        self._tls = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    def start(self, timeout_s: float = 60.0) -> None:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "image_preflight", "serve",
                 "--tls-cert", str(self.certs / "tls.crt"), "--tls-key", str(self.certs / "tls.key"),
                 *(("--kubeconfig", str(self.kubeconfig)) if self.kubeconfig else ()),
                 "--host", "127.0.0.1", "--port", str(self.port),
                 "--metrics-port", str(self.metrics_port), *self.extra],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self.popen.poll() is not None:
                raise RuntimeError(f"serve exited with {self.popen.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve not ready after {timeout_s:.0f} s:\n{self.tail()}")
            time.sleep(0.1)
        self.plane.network.expose(self.address, self.port)

    def stop(self) -> None:
        self.plane.network.withdraw(self.address)
        terminate(self.popen)

    def _connection(self, timeout_s: float) -> http.client.HTTPSConnection:
        """To the loopback port, speaking TLS to the Service's name as the apiserver does."""
        connection = http.client.HTTPSConnection(self.host, self.port, timeout=timeout_s, context=self._tls)
        connection.sock = self._tls.wrap_socket(socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s),
                                                server_hostname=self.host)
        return connection

    def ready(self) -> bool:
        try:
            connection = self._connection(2)
            try:
                connection.request("GET", "/readyz")
                return connection.getresponse().status == 200
            finally:
                connection.close()
        except OSError:
            return False

    def review(self, review: dict) -> dict:
        """POST an AdmissionReview straight to the webhook, as the apiserver would."""
        connection = self._connection(10)
        try:
            connection.request("POST", "/validate?timeout=5s", body=json.dumps(review).encode(),
                               headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            body = answer.read()
            assert answer.status == 200, body
            return json.loads(body)
        finally:
            connection.close()

    def decisions(self) -> list[dict]:
        """The decision log lines written so far (serve flushes its log every FLUSH_S)."""
        time.sleep(3 * FLUSH_S)
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"decision"' in line:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    pass
        return found

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
