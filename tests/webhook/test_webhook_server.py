"""`image-preflight serve` over real TLS, reached the way the apiserver reaches it."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import http.client
import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from image_preflight.certs.authority import issue_serving_cert, new_private_key
from image_preflight.certs.store import CertRequest, certificate_pem, ensure_certificates, private_key_pem
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.inventory import Inventory
from image_preflight.errors import InputError, UnavailableError
from image_preflight.files.atomic import write_atomic
from image_preflight.webhook.app import WebhookState, create_app, parse_timeout
from image_preflight.webhook.command import build_server
from image_preflight.webhook.metrics import Metrics
from tests.agent_lightning import fails_at_once
from tests.builders.reviews import ABSENT, EXAMPLE_NODES, missing_job_review, pod_spec, review, three_nodes, workload
from tests.serving import (
    DEADLINE,
    HOST,
    NAMESPACE,
    SERVICE,
    ServiceConnection,
    Webhook,
    client_context,
    issue_certificates,
    serve_args,
    wait_until,
)

WEBHOOK_NAME = "image-preflight.image-preflight.io"
HELD_ON_CPU = "jyangballin/swesmith.x86_64.pallets_1776_click.fde47b4b:openai"  # on cpu-node-1 in EXAMPLE_NODES


def rotate_serving_certificate(directory: Path) -> int:
    """A new key and certificate from the same CA, written over the old files; returns its serial."""
    files = ensure_certificates(directory, CertRequest(SERVICE, NAMESPACE), dt.datetime.now(dt.timezone.utc))
    key = new_private_key("ecdsa")
    cert = issue_serving_cert(files.ca, key, SERVICE, NAMESPACE, dt.datetime.now(dt.timezone.utc), 30)
    # Key first: until the certificate follows, the pair on disk does not match and must not be loaded.
    write_atomic(directory / "tls.key", private_key_pem(key), 0o600)
    write_atomic(directory / "tls.crt", certificate_pem(cert), 0o644)
    return cert.serial_number


@pytest.fixture
def example_webhook(start_webhook) -> Webhook:
    return start_webhook("--inventory", str(EXAMPLE_NODES))


# --- TLS as the apiserver sees it -----------------------------------------------------------------


def test_the_handshake_verifies_the_service_name_against_the_ca(example_webhook):
    connection = example_webhook.connect()
    try:
        assert connection.sock.version() in ("TLSv1.2", "TLSv1.3")
        assert connection.sock.selected_alpn_protocol() == "http/1.1"
        status, reply = example_webhook.post(missing_job_review(), connection=connection)
    finally:
        connection.close()
    assert status == 200 and reply["response"]["allowed"] is False


def test_a_wrong_server_name_fails_the_handshake(example_webhook):
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch|doesn't match|not valid"):
        example_webhook.connect("image-preflight.default.svc")


def test_a_client_trusting_another_ca_fails_the_handshake(example_webhook, tmp_path):
    issue_certificates(tmp_path / "other")
    connection = ServiceConnection(example_webhook.port, client_context(tmp_path / "other" / "ca.crt"))
    with pytest.raises(ssl.SSLCertVerificationError):
        connection.connect()


def test_curl_reaches_the_webhook_by_its_service_name(example_webhook, tmp_path):
    curl = shutil.which("curl")
    if curl is None:
        if os.environ.get("CI"):
            pytest.fail("curl is required under CI")
        pytest.skip("curl is not installed")
    body = tmp_path / "review.json"
    body.write_text(json.dumps(missing_job_review("curl-uid")))
    port = example_webhook.port
    result = subprocess.run(
        [curl, "--silent", "--show-error", "--fail-with-body", "--noproxy", "*", "--http1.1",
         "--cacert", str(example_webhook.certs / "ca.crt"), "--resolve", f"{HOST}:{port}:127.0.0.1",
         "-H", "Content-Type: application/json", "--data-binary", f"@{body}",
         f"https://{HOST}:{port}/validate?timeout=10s"],
        capture_output=True, text=True, timeout=DEADLINE,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["response"]["uid"] == "curl-uid" and reply["response"]["allowed"] is False

    wrong = subprocess.run(
        [curl, "--silent", "--show-error", "--noproxy", "*", "--cacert", str(example_webhook.certs / "ca.crt"),
         "--resolve", f"wrong.example.svc:{port}:127.0.0.1", f"https://wrong.example.svc:{port}/healthz"],
        capture_output=True, text=True, timeout=DEADLINE,
    )
    assert wrong.returncode != 0 and "certificate" in wrong.stderr.lower()


def test_unusable_files_are_input_errors_and_a_busy_port_unavailable(tmp_path):
    certs = tmp_path / "certs"
    issue_certificates(certs)
    inventory = ("--inventory", str(EXAMPLE_NODES), "--metrics-port", "0")

    with pytest.raises(InputError, match="no-such.crt: no such file"):
        build_server(serve_args(certs, *inventory, "--tls-cert", str(tmp_path / "no-such.crt")))

    broken = tmp_path / "nodes.json"
    broken.write_text('{"kind": "NodeList", "items": 7}')
    with pytest.raises(InputError, match="nodes.json: items: not a list"):
        build_server(serve_args(certs, "--inventory", str(broken), "--metrics-port", "0"))

    other = tmp_path / "other"
    issue_certificates(other)
    with pytest.raises(InputError, match="cannot load the certificate and key"):
        build_server(serve_args(certs, *inventory, "--tls-key", str(other / "tls.key")))

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        with pytest.raises(UnavailableError, match=f"--metrics-port {port}: cannot listen"):
            build_server(serve_args(certs, "--inventory", str(EXAMPLE_NODES), "--metrics-port", port))


# --- decisions over the wire --------------------------------------------------------------------


def test_a_job_with_an_image_absent_from_the_example_nodes_is_denied(example_webhook):
    rv = missing_job_review()
    status, reply = example_webhook.post(rv)

    assert status == 200
    assert reply["apiVersion"] == "admission.k8s.io/v1" and reply["kind"] == "AdmissionReview"
    response = reply["response"]
    assert response["uid"] == rv["request"]["uid"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422 and response["status"]["reason"] == "Invalid"
    message = response["status"]["message"]
    assert ABSENT in message and "cpu-node-1" in message and "IfNotPresent" in message
    assert "gpu-node-1" not in message  # tainted: the rollout pod cannot land there
    assert len(message.encode()) <= 1024
    assert fails_at_once(f'admission webhook "{WEBHOOK_NAME}" denied the request: {message}')


def test_a_job_whose_image_the_example_node_holds_is_allowed(example_webhook):
    rv = review(workload("Job", pod_spec(HELD_ON_CPU, nodeSelector={"pool": "cpu"})))
    status, reply = example_webhook.post(rv)
    assert status == 200
    assert reply["response"] == {"uid": rv["request"]["uid"], "allowed": True}


def test_the_decision_is_logged_as_one_json_line(example_webhook, caplog):
    caplog.set_level(logging.INFO, logger="image_preflight.decision")
    rv = missing_job_review("log-uid")
    example_webhook.post(rv)

    lines = [r.getMessage() for r in caplog.records if r.name == "image_preflight.decision"]
    [line] = [line for line in lines if '"log-uid"' in line]
    assert "\n" not in line
    record = json.loads(line)
    assert record["uid"] == "log-uid" and record["kind"] == "Job" and record["operation"] == "CREATE"
    assert record["namespace"] == "agl" and record["name"] == "rollout-7f3a"
    assert record["decision"] == "deny" and record["images"] == [ABSENT]
    assert isinstance(record["latency_ms"], (int, float)) and record["latency_ms"] >= 0


def test_an_unreadable_object_is_allowed_with_a_warning_and_logged(example_webhook, caplog):
    caplog.set_level(logging.INFO, logger="image_preflight.decision")
    rv = review(workload("Job", pod_spec(ABSENT)), uid="odd-uid")
    rv["request"]["object"]["spec"]["template"]["spec"]["containers"] = "rollout"
    status, reply = example_webhook.post(rv)

    assert status == 200
    assert reply["response"]["allowed"] is True and reply["response"]["warnings"]
    [line] = [r.getMessage() for r in caplog.records if '"odd-uid"' in r.getMessage()]
    assert json.loads(line)["decision"] == "unreadable"


# --- bad input ------------------------------------------------------------------------------------


def test_a_body_over_8_mib_is_413(example_webhook):
    status, reply = example_webhook.post(b"{" + b" " * (8 * 1024 * 1024) + b"}")
    assert status == 413 and "error" in reply


def test_a_chunked_body_over_8_mib_is_413(example_webhook):
    def chunks():
        yield b'{"apiVersion": "admission.k8s.io/v1", "padding": "'
        for _ in range(9):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    connection = example_webhook.connect()
    try:
        connection.request("POST", "/validate?timeout=10s", body=chunks(), encode_chunked=True,
                           headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        reply = connection.getresponse()
        assert reply.status == 413 and "error" in json.loads(reply.read())
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("body", "content_type", "complaint"),
    [
        (b"{not json", "application/json", "not JSON"),
        (json.dumps(missing_job_review()).encode(), "text/plain", "content type"),
        (json.dumps(missing_job_review()).encode(), "", "content type"),
        (b'{"apiVersion": "v1", "kind": "Pod"}', "application/json", "not an AdmissionReview"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
         "application/json", "request.uid"),
    ],
)
def test_bad_input_is_400_with_a_json_error(example_webhook, body, content_type, complaint):
    status, reply = example_webhook.post(body, content_type=content_type)
    assert status == 400
    assert complaint in reply["error"]


def test_deeply_nested_json_is_400_not_a_server_error(example_webhook):
    status, reply = example_webhook.post(b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and reply["error"].startswith("body is not JSON") and "depth" in reply["error"]


def test_a_body_that_stops_arriving_is_answered_within_the_request_timeout(example_webhook):
    connection = example_webhook.connect()
    try:
        connection.sock.sendall(
            f"POST /validate?timeout=1s HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n".encode() + b'{"apiVersion": "admission.k8s.io/v1"'
        )
        reply = http.client.HTTPResponse(connection.sock)
        reply.begin()
        assert reply.status == 408
        assert "timeout" in json.loads(reply.read())["error"]
    finally:
        connection.close()


def test_a_failing_inventory_is_never_a_500_and_leaves_the_webhook_unready():
    def broken() -> Inventory:
        raise RuntimeError("inventory unavailable")

    state = WebhookState(inventory=broken, ready=lambda: False, settings=Settings(), metrics=Metrics())

    async def exchange() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=create_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://webhook") as client:
            return [
                await client.post("/validate", json=missing_job_review("broken-uid")),
                await client.get("/readyz"),
                await client.get("/healthz"),
                await client.get("/validate"),
            ]

    validate, readyz, healthz, wrong_method = asyncio.run(exchange())
    assert validate.status_code == 200
    response = validate.json()["response"]
    assert response["uid"] == "broken-uid" and response["allowed"] is True
    assert any("internal error" in w for w in response["warnings"])
    assert readyz.status_code == 503 and healthz.status_code == 200
    assert wrong_method.status_code == 405


@pytest.mark.parametrize(
    ("value", "seconds"), [("10s", 10.0), ("1.5s", 1.5), ("500ms", 0.5), ("0.5m", 30.0), ("", 10.0), ("soon", 10.0)]
)
def test_the_request_timeout_is_read_as_a_go_duration(value, seconds):
    assert parse_timeout(value) == seconds


def test_the_connection_keeps_working_after_bad_input(example_webhook):
    connection = example_webhook.connect()
    try:
        assert example_webhook.post(b"[", connection=connection)[0] == 400
        status, reply = example_webhook.post(missing_job_review(), connection=connection)
        assert status == 200 and reply["response"]["allowed"] is False
    finally:
        connection.close()


# --- health, readiness, metrics ---------------------------------------------------------------------


def test_healthz_and_readyz_answer_over_tls(example_webhook):
    assert example_webhook.get("/healthz") == (200, {"status": "ok"})
    assert example_webhook.get("/readyz") == (200, {"status": "ready"})


def test_metrics_count_requests_and_describe_the_inventory(example_webhook):
    example_webhook.post(missing_job_review())
    example_webhook.post(review(workload("Job", pod_spec(HELD_ON_CPU))))
    example_webhook.post(review({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}))
    text = example_webhook.metrics()

    assert 'image_preflight_admission_requests_total{decision="deny",kind="Job",operation="CREATE"} 1.0' in text
    assert 'image_preflight_admission_requests_total{decision="allow",kind="Job",operation="CREATE"} 1.0' in text
    assert 'image_preflight_admission_requests_total{decision="skip",kind="other",operation="CREATE"} 1.0' in text
    assert "image_preflight_admission_duration_seconds_count 3.0" in text
    assert "image_preflight_inventory_nodes 2.0" in text
    # cpu-node-1: 7 rollout images + pause (digest and tag); gpu-node-1: verl (tag and digest).
    assert "image_preflight_inventory_images 11.0" in text
    assert "image_preflight_inventory_truncated_nodes 0.0" in text
    assert "image_preflight_inventory_age_seconds " in text
    assert "# TYPE image_preflight_watch_restarts_total counter" in text


def test_audit_mode_allows_logs_and_counts_what_it_would_deny(start_webhook, caplog):
    caplog.set_level(logging.INFO, logger="image_preflight.decision")
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES), "--mode", "audit")
    status, reply = webhook.post(missing_job_review("audit-uid"))

    assert status == 200 and reply["response"] == {"uid": "audit-uid", "allowed": True}
    [line] = [r.getMessage() for r in caplog.records if '"audit-uid"' in r.getMessage()]
    record = json.loads(line)
    assert record["decision"] == "audit" and ABSENT in record["detail"]
    assert 'image_preflight_admission_requests_total{decision="audit",kind="Job",operation="CREATE"} 1.0' in (
        webhook.metrics())


def test_warn_mode_allows_with_a_warning_naming_the_missing_image(start_webhook):
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES), "--mode", "warn")
    status, reply = webhook.post(missing_job_review())
    assert status == 200 and reply["response"]["allowed"] is True
    assert any(ABSENT in w and "cpu-node-1" in w for w in reply["response"]["warnings"])


# --- rotation and reloading ---------------------------------------------------------------------------


def test_a_rotated_certificate_reaches_new_handshakes_while_open_connections_keep_working(example_webhook):
    kept = example_webhook.connect()
    try:
        old_serial = kept.serial()
        assert example_webhook.post(missing_job_review(), connection=kept)[0] == 200
        kept_socket = kept.sock

        new_serial = rotate_serving_certificate(example_webhook.certs)
        assert new_serial != old_serial

        def new_connection_serial() -> bool:
            connection = example_webhook.connect()
            try:
                return connection.serial() == new_serial
            finally:
                connection.close()

        wait_until(new_connection_serial, "a new handshake presents the rotated certificate")

        status, reply = example_webhook.post(missing_job_review("after-rotation"), connection=kept)
        assert status == 200 and reply["response"]["uid"] == "after-rotation"
        assert kept.sock is kept_socket, "the client had to reconnect"
        assert kept.serial() == old_serial
    finally:
        kept.close()


def test_a_half_written_rotation_keeps_serving_the_old_certificate(example_webhook):
    # A key that matches no certificate yet: the reloader must keep what it has.
    first = example_webhook.connect()
    old_serial = first.serial()
    first.close()
    write_atomic(example_webhook.certs / "tls.key", private_key_pem(new_private_key("ecdsa")), 0o600)
    assert example_webhook.server.tls.reload_if_changed() is False
    connection = example_webhook.connect()
    try:
        assert connection.serial() == old_serial
        assert example_webhook.post(missing_job_review(), connection=connection)[0] == 200
    finally:
        connection.close()


def test_the_inventory_file_is_read_again_when_it_changes(start_webhook, tmp_path):
    snapshot = tmp_path / "nodes.json"
    nodes = json.loads(EXAMPLE_NODES.read_text())
    snapshot.write_text(json.dumps(nodes))
    webhook = start_webhook("--inventory", str(snapshot))
    assert webhook.post(missing_job_review())[1]["response"]["allowed"] is False

    cpu = next(n for n in nodes["items"] if n["metadata"]["name"] == "cpu-node-1")
    cpu["status"]["images"].append({"names": [f"docker.io/library/{ABSENT}"], "sizeBytes": 1_000_000_000})
    write_atomic(snapshot, json.dumps(nodes).encode(), 0o644)

    wait_until(lambda: webhook.post(missing_job_review())[1]["response"]["allowed"],
               "the rewritten snapshot is read")
    assert "image_preflight_inventory_images 12.0" in webhook.metrics()


# --- steering: POST /mutate on the same server ----------------------------------------------------


def test_with_steer_mutate_answers_a_pod_with_a_patch_and_validate_admits_its_job(start_webhook, tmp_path):
    image = "swe/steered:openai"
    webhook = start_webhook("--inventory", str(three_nodes(tmp_path / "nodes.json", image, ("b",))), "--steer")
    status, reply = webhook.post(review(workload("Pod", pod_spec(image))), path="/mutate?timeout=2s")
    assert status == 200 and reply["response"]["allowed"] is True and reply["response"]["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(reply["response"]["patch"]))
    assert operations[0]["path"] == "/spec/affinity"
    assert operations[0]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}
    status, reply = webhook.post(review(workload("Job", pod_spec(image))))
    assert status == 200 and reply["response"]["allowed"] is True  # one eligible node holds it
    assert 'decision="steered"' in webhook.metrics()


def test_without_steer_there_is_no_mutate(example_webhook):
    status, _ = example_webhook.post(review(workload("Pod", pod_spec(ABSENT))), path="/mutate?timeout=2s")
    assert status == 404


def test_a_stopping_server_closes_no_idle_connection_under_a_request(example_webhook, monkeypatch):
    """Go's transport retries no POST on a kept-alive connection the server closed under it
    (net/http transport.go, shouldRetryRequest): while stopping, the server tells the client with
    `Connection: close` instead, and closes a connection left idle only after IDLE_DRAIN_S."""
    from image_preflight.webhook import protocol
    monkeypatch.setattr(protocol, "IDLE_DRAIN_S", 1.5)
    used, idle = example_webhook.connect(), example_webhook.connect()
    for connection in (used, idle):
        assert example_webhook.post(missing_job_review(), connection=connection)[0] == 200
    example_webhook.server.should_exit = True
    time.sleep(0.5)  # shutting down: the listener is closed, both connections kept
    with pytest.raises(OSError):
        example_webhook.connect()
    used.request("POST", "/validate?timeout=10s", body=json.dumps(missing_job_review()).encode(), headers={
        "Host": f"{HOST}:{example_webhook.port}", "Content-Type": "application/json"})
    reply = used.getresponse()
    assert reply.status == 200 and reply.getheader("connection") == "close"
    reply.read()
    used.close()  # as a Go client does on Connection: close
    assert example_webhook.thread.is_alive()  # the idle one is still open
    idle.sock.settimeout(5)
    start = time.monotonic()
    assert idle.sock.recv(1) == b""  # closed by the server, after the drain
    assert 0.5 < time.monotonic() - start < 3.0
    idle.close()
    example_webhook.thread.join(timeout=10)
    assert not example_webhook.thread.is_alive()
