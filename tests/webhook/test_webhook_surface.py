"""What `serve` gives a caller that is not the apiserver: a deadline it cannot stretch, memory it
cannot hold, a TLS version it cannot lower, and with --client-ca no answer at all."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import socket
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from image_preflight.errors import InputError
from image_preflight.webhook import app
from image_preflight.webhook.app import parse_timeout
from image_preflight.webhook.command import build_server
from tests.builders.reviews import EXAMPLE_NODES, missing_job_review
from tests.serving import HOST, ServiceConnection, client_context, issue_certificates, serve_args


def _slow_request(webhook, query: str = "timeout=3600s"):
    """A request announcing an 8 MiB body and sending its first bytes only."""
    connection = webhook.connect()
    connection.sock.sendall(
        f"POST /validate?{query} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {8 * 1024 * 1024}\r\n\r\n".encode() + b'{"apiVersion": "admission.k8s.io/v1"')
    return connection


def _answer(connection, within_s: float) -> tuple[int, dict]:
    """The answer to a request sent on `connection`, which must come within `within_s`; closes it."""
    try:
        started = time.monotonic()
        reply = http.client.HTTPResponse(connection.sock)
        reply.begin()
        answer = reply.status, json.loads(reply.read())
        assert time.monotonic() - started < within_s
        return answer
    finally:
        connection.close()


@pytest.mark.parametrize(("value", "seconds"), [("3600s", 30.0), ("60m", 30.0), ("30s", 30.0), ("29s", 29.0)])
def test_a_requested_timeout_is_capped_at_the_apiservers_30_seconds(value, seconds):
    # pkg/apis/admissionregistration/validation/validation.go, validateWebhook: timeoutSeconds 1..30.
    assert parse_timeout(value) == seconds


def test_a_slow_8_mib_body_asking_an_hour_is_answered_408_at_the_cap(start_webhook, monkeypatch):
    monkeypatch.setattr(app, "MAX_TIMEOUT", 1.0)  # the cap, as 30 s would make the test wait 27 s
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES))
    status, reply = _answer(_slow_request(webhook), within_s=5)
    assert status == 408 and "timeout" in reply["error"]


def test_slow_bodies_beyond_the_bound_are_refused_at_once_and_others_still_answered(start_webhook, monkeypatch):
    monkeypatch.setattr(app, "MAX_SLOW_BODIES", 2)
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES))
    held = [_slow_request(webhook) for _ in range(2)]
    try:
        time.sleep(0.3)  # both are being read
        status, reply = _answer(_slow_request(webhook), within_s=2)
        assert status == 503 and "already arriving" in reply["error"]
        status, reply = webhook.post(missing_job_review())  # a whole body needs no slot
        assert status == 200 and reply["response"]["allowed"] is False
    finally:
        for connection in held:
            connection.close()


def _handshake(port: int, context: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=HOST) as tls:
            return tls.version()


def test_tls_1_3_is_the_floor_by_default_and_1_2_only_when_asked(start_webhook, tmp_path):
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES))
    only_12 = client_context(webhook.certs / "ca.crt")
    only_12.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError):
        _handshake(webhook.port, only_12)
    assert _handshake(webhook.port, client_context(webhook.certs / "ca.crt")) == "TLSv1.3"

    older = start_webhook("--inventory", str(EXAMPLE_NODES), "--tls-min-version", "1.2")
    assert _handshake(older.port, only_12) == "TLSv1.2"


def _client_authority(directory: Path) -> tuple[Path, Path, Path]:
    """A CA of the apiserver's and a client certificate it issued: (ca.crt, client.crt, client.key)."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "apiserver-client-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    client = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
              .issuer_name(ca_name).public_key(client_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
              .sign(ca_key, hashes.SHA256()))
    directory.mkdir()
    paths = directory / "client-ca.crt", directory / "client.crt", directory / "client.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(client.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(client_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return paths


def test_with_client_ca_only_the_apiservers_certificate_is_answered_and_probes_still_work(start_webhook, tmp_path):
    client_ca, client_crt, client_key = _client_authority(tmp_path / "client")
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES), "--client-ca", str(client_ca))

    status, reply = webhook.post(missing_job_review())  # no certificate: no decision, no node names
    assert status == 401 and "client certificate" in reply["error"] and "cpu-node" not in json.dumps(reply)
    assert webhook.get("/healthz")[0] == 200  # the kubelet's probes present none

    context = client_context(webhook.certs / "ca.crt")
    context.load_cert_chain(client_crt, client_key)
    apiserver = ServiceConnection(webhook.port, context)
    apiserver.connect()
    status, reply = webhook.post(missing_job_review(), connection=apiserver)
    apiserver.close()
    assert status == 200 and reply["response"]["allowed"] is False

    stranger = tmp_path / "stranger"
    issue_certificates(stranger)  # a certificate from another CA fails the handshake itself
    context = client_context(webhook.certs / "ca.crt")
    context.load_cert_chain(stranger / "tls.crt", stranger / "tls.key")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        forged = ServiceConnection(webhook.port, context)
        forged.connect()
        webhook.post(missing_job_review(), connection=forged)


def test_an_unreadable_client_ca_is_a_one_line_input_error(tmp_path):
    certs = tmp_path / "certs"
    issue_certificates(certs)
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(InputError, match=r"^--client-ca .*ca.pem: cannot load CA certificates"):
        build_server(serve_args(certs, "--inventory", str(EXAMPLE_NODES), "--metrics-port", "0",
                                "--client-ca", str(tmp_path / "ca.pem")))
