"""`image-preflight serve` in a thread of the test, reached over real TLS the way the apiserver
reaches it: verified against the CA, the Service's DNS name presented, http/1.1 by ALPN."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from image_preflight.cli import build_parser
from image_preflight.webhook.config import ServeConfig

# The server stack (uvicorn, cryptography) is imported where it is used: wait_until serves the
# pure tests too, with the base install alone.
if TYPE_CHECKING:
    import uvicorn


SERVICE = NAMESPACE = "image-preflight"
HOST = f"{SERVICE}.{NAMESPACE}.svc"
DEADLINE = 15.0


def wait_until(condition: Callable[[], object], what: str, deadline: float = DEADLINE) -> object:
    end = time.monotonic() + deadline
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def issue_certificates(directory: Path) -> None:
    from image_preflight.certs.store import CertRequest, ensure_certificates

    ensure_certificates(directory, CertRequest(SERVICE, NAMESPACE), dt.datetime.now(dt.timezone.utc))


def client_context(ca_file: Path) -> ssl.SSLContext:
    """What the apiserver does: verify against caBundle, offer http/1.1 by ALPN."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.set_alpn_protocols(["http/1.1"])
    return context


class ServiceConnection(http.client.HTTPConnection):
    """HTTPS to 127.0.0.1 that presents and verifies the Service's DNS name, as the apiserver does."""

    def __init__(self, port: int, context: ssl.SSLContext, server_name: str = HOST):
        super().__init__("127.0.0.1", port, timeout=DEADLINE)
        self._context, self._server_name = context, server_name

    def connect(self) -> None:
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)

    def serial(self) -> int:
        from cryptography import x509

        return x509.load_der_x509_certificate(self.sock.getpeercert(binary_form=True)).serial_number


@dataclass
class Webhook:
    server: uvicorn.Server
    thread: threading.Thread
    port: int
    metrics_port: int
    certs: Path

    def connect(self, server_name: str = HOST) -> ServiceConnection:
        connection = ServiceConnection(self.port, client_context(self.certs / "ca.crt"), server_name)
        connection.connect()
        return connection

    def post(self, body: bytes | dict, *, connection: ServiceConnection | None = None,
             content_type: str = "application/json", path: str = "/validate?timeout=10s") -> tuple[int, dict]:
        own = connection is None
        connection = connection or self.connect()
        try:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            connection.request("POST", path, body=data, headers={
                "Host": f"{HOST}:{self.port}", "Content-Type": content_type, "Accept": "application/json"})
            reply = connection.getresponse()
            return reply.status, json.loads(reply.read())
        finally:
            if own:
                connection.close()

    def get(self, path: str) -> tuple[int, dict]:
        connection = self.connect()
        try:
            connection.request("GET", path, headers={"Host": f"{HOST}:{self.port}"})
            reply = connection.getresponse()
            return reply.status, json.loads(reply.read())
        finally:
            connection.close()

    def metrics(self) -> str:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=DEADLINE
        ) as reply:
            return reply.read().decode()


def serve_args(certs: Path, *extra: str) -> ServeConfig:
    return ServeConfig.from_args(build_parser()[0].parse_args([
        "serve", "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
        "--host", "127.0.0.1", "--port", "0", *extra,
    ]))


def serving_webhooks(tmp_path: Path) -> Iterator[Callable[..., Webhook]]:
    """Start `serve` in a thread with the given extra arguments; stopped cleanly after the test."""
    from image_preflight.webhook.command import build_server, stop_background

    started: list[Webhook] = []

    def start(*extra: str) -> Webhook:
        certs = tmp_path / "certs"
        if not (certs / "tls.crt").exists():
            issue_certificates(certs)
        metrics_port = free_port()
        server = build_server(serve_args(
            certs, "--metrics-port", str(metrics_port),
            "--tls-reload-interval", "0.05", "--inventory-reload-interval", "0.05", *extra,
        ))
        thread = threading.Thread(target=server.run, name="webhook", daemon=True)
        thread.start()
        wait_until(lambda: server.started or not thread.is_alive(), "the server listens")
        assert server.started, "the server failed to start"
        port = server.servers[0].sockets[0].getsockname()[1]
        webhook = Webhook(server, thread, port, metrics_port, certs)
        started.append(webhook)
        return webhook

    yield start
    for webhook in started:
        webhook.server.should_exit = True
        webhook.thread.join(timeout=DEADLINE)
        stop_background(webhook.server)
        assert not webhook.thread.is_alive(), "the server did not shut down"
