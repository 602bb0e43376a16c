"""With --client-name, /validate and /mutate answer only a caller whose certificate from --client-ca
holds one of the names: a CA that signs the kubelets' and the users' certificates too (the
cluster's own) then lets only the apiserver's through. Over real TLS, the way the apiserver calls."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from image_preflight.errors import UsageError
from image_preflight.webhook.config import ServeConfig
from image_preflight.webhook.tls import CallerNames, caller_names
from tests.builders.reviews import EXAMPLE_NODES, missing_job_review
from tests.controlplane.pki import Authority
from tests.serving import ServiceConnection, client_context


def _client(authority: Authority, stem: str, cn: str, dns: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A client certificate of `authority` with subject CN `cn` and DNS names `dns`."""
    key, now = ec.generate_private_key(ec.SECP256R1()), dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
               .issuer_name(authority.cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if dns:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns]), critical=False)
    crt, pem = authority.folder / f"{stem}.crt", authority.folder / f"{stem}.key"
    crt.write_bytes(builder.sign(authority.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


@pytest.fixture
def cluster_ca(tmp_path) -> Authority:
    folder = tmp_path / "cluster-ca"
    folder.mkdir()
    return Authority(folder)


def _post_as(webhook, certificate: tuple[Path, Path], path: str = "/validate?timeout=10s") -> tuple[int, dict]:
    context = client_context(webhook.certs / "ca.crt")
    context.load_cert_chain(*certificate)
    connection = ServiceConnection(webhook.port, context)
    connection.connect()
    try:
        return webhook.post(missing_job_review(), connection=connection, path=path)
    finally:
        connection.close()


def test_a_certificate_of_the_right_ca_but_another_name_is_refused_403_and_the_named_one_answered(
        start_webhook, cluster_ca):
    apiserver = _client(cluster_ca, "apiserver", "kube-apiserver-webhook-client")
    kubelet = _client(cluster_ca, "kubelet", "system:node:worker-1")
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES), "--steer", "--client-ca", str(cluster_ca.cert_path),
                            "--client-name", "kube-apiserver-webhook-client")

    for path in ("/validate?timeout=10s", "/mutate?timeout=10s"):
        status, reply = _post_as(webhook, kubelet, path)
        assert status == 403 and "cpu-node" not in json.dumps(reply)  # no decision, no node names
        assert reply["error"] == ("the client certificate (CN 'system:node:worker-1') names no caller allowed by "
                                  "--client-name")
        status, reply = _post_as(webhook, apiserver, path)
        assert status == 200 and reply["response"]["uid"] == missing_job_review()["request"]["uid"]
    assert webhook.post(missing_job_review())[0] == 401  # no certificate at all
    assert webhook.get("/healthz")[0] == 200 and webhook.get("/readyz")[0] == 200  # the kubelet's probes


def test_a_dns_name_of_the_certificate_matches_without_case(start_webhook, cluster_ca):
    named = _client(cluster_ca, "named", "front", dns=("Webhook-Client.kube-system.svc",))
    other = _client(cluster_ca, "other", "webhook-client.kube-system.svc")  # the name as its CN
    webhook = start_webhook("--inventory", str(EXAMPLE_NODES), "--client-ca", str(cluster_ca.cert_path),
                            "--client-name", "webhook-client.kube-system.svc", "--client-name", "another")
    assert _post_as(webhook, named)[0] == 200
    status, reply = _post_as(webhook, _client(cluster_ca, "stranger", "front", dns=("x.kube-system.svc",)))
    assert status == 403 and reply["error"].startswith("the client certificate (CN 'front', DNS 'x.kube-system.svc')")
    # A name is looked for in both places.
    assert _post_as(webhook, other)[0] == 200


def test_the_names_read_are_the_subject_common_name_and_the_dns_names():
    peercert = {"subject": ((("countryName", "DE"),), (("commonName", "kube-apiserver"),)),
                "subjectAltName": (("DNS", "API.example"), ("IP Address", "10.0.0.1"), ("email", "a@b"))}
    assert caller_names(peercert) == (("kube-apiserver",), ("api.example",))
    names = CallerNames(["kube-apiserver"])
    assert names.admit(caller_names(peercert)) and not names.admit((("Kube-Apiserver",), ()))
    assert CallerNames(["Api.Example"]).admit(caller_names(peercert))
    assert not CallerNames(["10.0.0.1"]).admit(caller_names(peercert))  # only DNS names count


def test_client_name_without_client_ca_is_refused_naming_both():
    with pytest.raises(UsageError, match=r"^--client-name needs --client-ca"):
        ServeConfig(tls_cert=Path("c"), tls_key=Path("k"), client_names=frozenset({"kube-apiserver"}))
