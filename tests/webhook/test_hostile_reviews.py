"""`serve` against hostile bodies over real TLS: every defect found by fuzzing it from outside has a
regression here, and a seeded structure-aware fuzz checks every answer against the apiserver's
rules for an AdmissionReview response."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import logging
import random
import socket
import time

import pytest

from image_preflight.core.admission.messages import MAX_MESSAGE, denial_message
from image_preflight.core.decide.decision import MISSING, Decision, ImageVerdict
from image_preflight.core.decide.workloads import ContainerImage
from image_preflight.webhook import protocol
from image_preflight.webhook.protocol import DeadlineProtocol
from tests.builders.reviews import EXAMPLE_NODES, missing_job_review, pod_spec, review, three_nodes, workload
from tests.serving import HOST, Webhook, client_context

ABSENT = "swesmith.x86_64.absent:openai"
HELD = "jyangballin/swesmith.x86_64.mahmoud_1776_boltons.3bfe2bb7:openai"


@pytest.fixture
def webhook(start_webhook, caplog) -> Webhook:
    caplog.set_level(logging.WARNING, logger="image_preflight")
    return start_webhook("--inventory", str(EXAMPLE_NODES))


def _post(webhook: Webhook, body: bytes, connection: http.client.HTTPConnection | None = None,
          path: str = "/validate") -> tuple[int, bytes, http.client.HTTPConnection]:
    connection = connection or webhook.connect()
    connection.request("POST", f"{path}?timeout=10s", body=body,
                       headers={"Host": f"{HOST}:{webhook.port}", "Content-Type": "application/json"})
    reply = connection.getresponse()
    return reply.status, reply.read(), connection


def _answer(webhook: Webhook, body: bytes) -> tuple[int, dict | None]:
    status, data, connection = _post(webhook, body)
    connection.close()
    return status, json.loads(data) if status == 200 else None


def _text(value: object) -> bytes:
    return json.dumps(value).encode()


def _no_internal_errors(caplog) -> None:
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


# --- regressions --------------------------------------------------------------------------------


def test_a_number_of_thousands_of_digits_is_400(webhook, caplog):
    body = _text(review(workload("Job", pod_spec(ABSENT)))).replace(b'"backoffLimit": 0',
                                                                    b'"backoffLimit": 1' + b"0" * 5000)
    assert _answer(webhook, body)[0] == 400
    _no_internal_errors(caplog)


def test_an_update_whose_containers_are_not_a_list_is_unreadable_not_an_internal_error(webhook, caplog):
    old = workload("Job", pod_spec(HELD))
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"] = {"name": "agent", "image": ABSENT}
    status, reply = _answer(webhook, _text(review(new, operation="UPDATE", old=old)))
    assert status == 200 and reply["response"]["allowed"] is True
    assert reply["response"]["warnings"][0].startswith("image-preflight could not read the object: ")
    _no_internal_errors(caplog)


def test_a_gt_value_of_thousands_of_digits_is_an_invalid_term_not_an_internal_error(webhook, caplog):
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "cpu", "operator": "Gt", "values": ["9" * 5000]}]}]}}}
    status, reply = _answer(webhook, _text(review(workload("Job", pod_spec(ABSENT, affinity=affinity)))))
    assert status == 200 and "internal error" not in json.dumps(reply)
    _no_internal_errors(caplog)


@pytest.mark.parametrize("raw", [
    b'"\\ud800"',  # a lone surrogate escape: Go never writes one
    b'"\xed\xa0\x80"',  # a surrogate encoded as UTF-8 bytes (CESU-8): not UTF-8 at all
    b'"\xff"',
])
def test_text_that_is_not_unicode_is_400_so_the_uid_can_never_come_back_changed(webhook, raw):
    body = _text(review(workload("Job", pod_spec(ABSENT)))).replace(b'"705ab4f5-6393-11e8-b7cc-42010a800002"', raw)
    assert _answer(webhook, body)[0] == 400


def test_a_lone_surrogate_in_a_node_selector_key_is_400_not_an_internal_error(webhook, caplog):
    body = _text(review(workload("Job", pod_spec(ABSENT, nodeSelector={"KEY": "v"})))).replace(b'"KEY"', b'"\\udc80"')
    assert _answer(webhook, body)[0] == 400
    _no_internal_errors(caplog)


def test_a_kind_outside_the_decided_ones_is_labelled_other_and_metrics_keep_working(webhook):
    for kind in ("\u00e9\u4e2d", "Widget", "x" * 1000):
        status, _ = _answer(webhook, _text(review({"apiVersion": "v1", "kind": kind, "metadata": {"name": "w"}},
                                                  kind=kind, group="example.com")))
        assert status == 200
    text = webhook.metrics()
    assert 'image_preflight_admission_requests_total{decision="skip",kind="other",operation="CREATE"} 3.0' in text


def test_the_denial_for_sixteen_thousand_images_keeps_the_limit_and_counts_the_rest():
    verdicts = tuple(ImageVerdict(ContainerImage(f"c{i}", "containers", f"swe/img-{i}:openai", "IfNotPresent"),
                                  MISSING, missing_on=("cpu-1",)) for i in range(16_000))
    message = denial_message(Decision("deny", verdicts, ("cpu-1",)))
    assert len(message.encode()) <= MAX_MESSAGE
    assert message.startswith("invalid: image 'swe/img-0:openai'")
    shown = message.count("is absent from")
    assert f"; and {16_000 - shown} more image(s); the pod would wait in ImagePullBackOff" in message


def test_the_denial_names_every_image_that_fits_as_before():
    verdicts = tuple(ImageVerdict(ContainerImage(f"c{i}", "containers", f"swe/img-{i}:openai", "IfNotPresent"),
                                  MISSING, missing_on=("cpu-1",)) for i in range(3))
    message = denial_message(Decision("deny", verdicts, ("cpu-1",)))
    assert message.count("is absent from eligible node(s) cpu-1") == 3 and "more image(s)" not in message


def test_headers_that_trickle_in_are_cut_off_at_the_deadline(webhook, monkeypatch):
    monkeypatch.setattr(DeadlineProtocol, "header_deadline", 0.5)
    connection = webhook.connect()
    started = time.monotonic()
    connection.sock.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
    connection.sock.settimeout(5)
    for _ in range(20):  # one header line every 0.1 s: never complete
        try:
            connection.sock.sendall(b"X-Slow: 1\r\n")
        except OSError:
            break
        time.sleep(0.1)
    try:
        assert connection.sock.recv(1) == b""  # closed by the server, no answer
    except OSError:
        pass
    assert time.monotonic() - started < 2.5
    connection.close()


def test_a_connection_that_says_nothing_is_closed_at_the_deadline(webhook, monkeypatch):
    monkeypatch.setattr(DeadlineProtocol, "header_deadline", 0.5)
    connection = webhook.connect()
    connection.sock.settimeout(5)
    started = time.monotonic()
    try:
        assert connection.sock.recv(1) == b""
    except OSError:
        pass
    assert time.monotonic() - started < 2.5


def _closed_at(sock: socket.socket, until: float) -> float | None:
    """When (time.monotonic()) the server closed `sock`; None if still open at `until`."""
    sock.settimeout(max(0.01, until - time.monotonic()))
    try:
        while sock.recv(1024):
            pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.monotonic()


def test_one_deadline_runs_from_the_tcp_accept_through_the_handshake_to_the_headers(start_webhook, monkeypatch):
    """asyncio gives a TLS handshake 60 s of its own; here the header deadline counts from the
    accept: ten sockets that never start TLS, one that trickles its ClientHello and one whose
    handshake comes late and whose headers never end are all closed by then."""
    monkeypatch.setattr(DeadlineProtocol, "header_deadline", 1.0)
    monkeypatch.setattr(protocol, "SWEEP_S", 0.1)
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES))
    accepted = time.monotonic()
    silent = [socket.create_connection(("127.0.0.1", webhook.port)) for _ in range(10)]
    trickling = socket.create_connection(("127.0.0.1", webhook.port))
    trickling.sendall(b"\x16\x03\x01")  # the first bytes of a TLS record, the rest never sent
    late = socket.create_connection(("127.0.0.1", webhook.port))
    time.sleep(0.8)  # most of the deadline spent before the handshake starts
    tls = client_context(webhook.certs / "ca.crt").wrap_socket(late, server_hostname=HOST)
    tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n")  # headers never completed
    for sock in (*silent, trickling, tls):
        closed = _closed_at(sock, accepted + 10.0)
        assert closed is not None and closed - accepted < 1.0 + 0.5, None if closed is None else closed - accepted
        sock.close()
    assert webhook.post(missing_job_review())[0] == 200  # and the server answers as before


def test_after_a_408_the_connection_is_closed(webhook):
    connection = webhook.connect()
    connection.sock.sendall(
        f"POST /validate?timeout=1s HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n".encode() + b'{"apiVersion": "admission.k8s.io/v1"')
    reply = http.client.HTTPResponse(connection.sock)
    reply.begin()
    assert reply.status == 408 and reply.getheader("connection") == "close"
    reply.read()
    connection.sock.settimeout(5)
    try:
        assert connection.sock.recv(1) == b""
    except OSError:
        pass
    connection.close()


# --- a seeded, structure-aware fuzz -------------------------------------------------------------

_HOSTILE_RAW = [b"1" + b"0" * 5000, b"-1e999", b"NaN", b'"\\ud800"', b'"\\udfff\\ud800"', b"[" * 2000 + b"]" * 2000,
                b'"' + b"x" * 100_000 + b'"', b"1e308", b"18446744073709551616", b"-0", b'"\\u0000"']
_HOSTILE_VALUES = [None, True, 0, -1, 2**63, 1.5, "", "a" * 300, "\u00e9\u4e2d\U0001f600", [], {}, [None], {"": {}},
                   ["x"] * 50, "UPPER/case:tag", "sha256:" + "a" * 64, "Gt", "In", "NoSchedule"]


def _bases() -> list[dict]:
    held = pod_spec(HELD, nodeSelector={"kubernetes.io/hostname": "cpu-node-1"},
                    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "cpu", "operator": "Gt", "values": ["3"]}],
         "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["cpu-node-1"]}]}]}}}
    job = workload("Job", held)
    return [
        review(job), review(workload("Pod", pod_spec(ABSENT, affinity=affinity))),
        review(workload("Job", pod_spec(ABSENT, volumes=[{"name": "v", "image": {"reference": HELD}}]))),
        review(job, operation="UPDATE", old=workload("Job", pod_spec(ABSENT))),
        review(workload("CronJob", pod_spec(HELD, runtimeClassName="gvisor"))),
        review(workload("Pod", pod_spec(HELD, nodeName="cpu-node-1", schedulingGates=[{"name": "q"}]))),
    ]


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _mutate(rng: random.Random, base: dict) -> bytes:
    body = copy.deepcopy(base)
    marker = None
    for _ in range(rng.randint(1, 3)):
        path = rng.choice([p for p in _paths(body) if p])
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        choice = rng.random()
        if choice < 0.25:
            marker = f"@@raw-{rng.randrange(10**9)}@@"
            parent[path[-1]] = marker
            raw = rng.choice(_HOSTILE_RAW)
        elif choice < 0.35 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(_HOSTILE_VALUES))
    text = json.dumps(body).encode()
    if marker is not None:
        text = text.replace(json.dumps(marker).encode(), raw)
    return text


def _fuzz(webhook: Webhook, bases: list[dict], path: str, rounds: int) -> list[dict]:
    """Post `rounds` mutated bases; check each answer as the apiserver would; the responses."""
    rng = random.Random(20261130)
    connection = None
    responses, refused = [], 0
    for _ in range(rounds):
        body = _mutate(rng, rng.choice(bases))
        try:
            status, data, connection = _post(webhook, body, connection, path)
        except (http.client.HTTPException, OSError):
            connection = None  # the server closed a connection after a 4xx: open another
            status, data, connection = _post(webhook, body, None, path)
        assert status < 500, body[:300]
        if status != 200:
            refused += 1
            continue
        sent = json.loads(body)
        reply = json.loads(data)
        assert (reply["apiVersion"], reply["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
        response = reply["response"]
        # The apiserver matches the uid as a string; ours must be the very one sent.
        assert response["uid"] == sent["request"]["uid"] and isinstance(response["uid"], str)
        if not response["allowed"]:
            assert isinstance(response["status"]["code"], int) and response["status"]["message"]
        warnings = response.get("warnings", [])
        assert all(len(w) <= 256 for w in warnings) and len("".join(warnings).encode()) <= 4096
        assert not any("internal error" in w for w in warnings), (warnings, body[:300])
        responses.append(response)
    connection.close()
    assert len(responses) > rounds // 3 and refused > rounds // 30  # both kinds of body were really sent
    return responses


def test_fuzzed_reviews_never_get_a_5xx_an_internal_error_or_an_answer_the_apiserver_would_refuse(webhook, caplog):
    _fuzz(webhook, _bases(), "/validate", 3000)
    _no_internal_errors(caplog)


def test_fuzzed_pods_at_mutate_always_get_an_allowed_answer_and_patches_of_adds(start_webhook, caplog, tmp_path):
    caplog.set_level(logging.WARNING, logger="image_preflight")
    webhook = start_webhook("--inventory", str(three_nodes(tmp_path / "nodes.json", HELD, ("b",))), "--steer")
    bases = [b for b in _bases() if b["request"]["kind"]["kind"] == "Pod"] + [review(workload("Pod", pod_spec(HELD)))]
    responses = _fuzz(webhook, bases, "/mutate", 1500)
    assert all(r["allowed"] is True for r in responses)
    patches = [json.loads(base64.b64decode(r["patch"])) for r in responses if "patch" in r]
    assert patches and all(r["patchType"] == "JSONPatch" for r in responses if "patch" in r)
    assert all(op["op"] == "add" and op["path"].startswith(("/spec/", "/metadata/")) for ops in patches for op in ops)
    _no_internal_errors(caplog)
