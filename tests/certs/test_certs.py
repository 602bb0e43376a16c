"""`image-preflight certs`: the chain the apiserver verifies, idempotent files, manifests."""

from __future__ import annotations

import base64
import datetime as dt
import errno
import os
import shutil
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import DNSName, PolicyBuilder, Store, VerificationError

from image_preflight.certs.authority import service_dns_names
from image_preflight.certs.store import CertRequest, ensure_certificates
from image_preflight.cli import main
from image_preflight.errors import InputError
from image_preflight.files import atomic

SERVICE, NAMESPACE = "preflight", "ops"
HOST = f"{SERVICE}.{NAMESPACE}.svc"
FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key")


def run_certs(capsys, out_dir: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["certs", "--service", SERVICE, "--namespace", NAMESPACE, "--out-dir", str(out_dir), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def snapshot(out_dir: Path) -> dict[str, bytes]:
    return {name: (out_dir / name).read_bytes() for name in FILES}


def verify_chain(out_dir: Path, hostname: str = HOST, now: dt.datetime | None = None) -> list[x509.Certificate]:
    ca, leaf = read_cert(out_dir / "ca.crt"), read_cert(out_dir / "tls.crt")
    builder = PolicyBuilder().store(Store([ca]))
    if now is not None:
        builder = builder.time(now)
    return builder.build_server_verifier(DNSName(hostname)).verify(leaf, [])


# --- the certificates -------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["ecdsa", "rsa"])
def test_serving_certificate_chains_to_ca_with_service_names(capsys, tmp_path, key):
    code, _, err = run_certs(capsys, tmp_path, "--key", key)

    assert code == 0, err
    chain = verify_chain(tmp_path)
    assert chain[-1] == read_cert(tmp_path / "ca.crt")
    with pytest.raises(VerificationError):
        verify_chain(tmp_path, hostname=f"other.{NAMESPACE}.svc")

    leaf = read_cert(tmp_path / "tls.crt")
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        SERVICE, f"{SERVICE}.{NAMESPACE}", HOST, f"{HOST}.cluster.local"
    ]
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == HOST
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    usage = leaf.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature and not usage.value.key_cert_sign
    assert usage.value.key_encipherment is (key == "rsa")
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False

    ca = read_cert(tmp_path / "ca.crt")
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    ca_usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ca_usage.key_cert_sign and ca_usage.crl_sign
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest

    public_key = leaf.public_key()
    if key == "rsa":
        assert isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size == 2048
    else:
        assert isinstance(public_key, ec.EllipticCurvePublicKey) and public_key.curve.name == "secp256r1"


def test_files_hold_one_pem_each_and_keys_are_private(capsys, tmp_path):
    out_dir = tmp_path / "new" / "dir"
    code, _, err = run_certs(capsys, out_dir)

    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(FILES)  # no temp files left
    assert stat.S_IMODE((out_dir / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out_dir / "tls.key").stat().st_mode) == 0o600
    assert (out_dir / "tls.crt").read_text().count("BEGIN CERTIFICATE") == 1
    assert (out_dir / "ca.crt").read_text().count("BEGIN CERTIFICATE") == 1
    assert "created CA" in err and f"issued serving certificate {out_dir / 'tls.crt'} for {HOST}" in err


@pytest.mark.parametrize("key", ["ecdsa", "rsa"])
def test_tls_handshake_verifies_service_name_and_rejects_others(capsys, tmp_path, key):
    assert run_certs(capsys, tmp_path, "--key", key)[0] == 0

    assert handshake(tmp_path, HOST) == b"ok"
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tmp_path, f"other.{NAMESPACE}.svc")


def handshake(cert_dir: Path, server_hostname: str) -> bytes:
    """Serve tls.crt/tls.key on an ephemeral port and connect as a client trusting ca.crt."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    client_context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(30)  # never hang the suite if the client dies early

        def serve() -> None:
            try:
                conn, _ = listener.accept()
                with server_context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass  # the client rejected us; the client side reports it

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=30) as raw:
                with client_context.wrap_socket(raw, server_hostname=server_hostname) as tls:
                    return tls.recv(2)
        finally:
            thread.join(timeout=30)


# --- idempotency and renewal ------------------------------------------------------------------


def test_second_run_keeps_both_certificates(capsys, tmp_path):
    run_certs(capsys, tmp_path)
    before = snapshot(tmp_path)

    code, _, err = run_certs(capsys, tmp_path)

    assert code == 0
    assert snapshot(tmp_path) == before
    assert f"kept CA {tmp_path / 'ca.crt'}" in err
    assert f"kept serving certificate {tmp_path / 'tls.crt'}" in err


def test_serving_certificate_inside_renewal_window_is_reissued_and_ca_kept(capsys, tmp_path):
    run_certs(capsys, tmp_path, "--days", "10", "--renew-before", "5")
    before = snapshot(tmp_path)

    code, _, err = run_certs(capsys, tmp_path)  # defaults: --days 365 --renew-before 30

    after = snapshot(tmp_path)
    assert code == 0
    assert after["ca.crt"] == before["ca.crt"] and after["ca.key"] == before["ca.key"]
    assert after["tls.crt"] != before["tls.crt"] and after["tls.key"] != before["tls.key"]
    assert "kept CA" in err and "expires within 30 days" in err
    verify_chain(tmp_path)


def test_clock_moves_into_windows_renews_leaf_then_ca(tmp_path):
    now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    request = CertRequest(SERVICE, NAMESPACE, days=365, ca_days=3650, renew_before_days=30)
    first = ensure_certificates(tmp_path, request, now)

    late_leaf = ensure_certificates(tmp_path, request, now + dt.timedelta(days=340))
    assert not late_leaf.ca_created and late_leaf.serving_issued
    assert late_leaf.ca.cert == first.ca.cert

    late_ca = ensure_certificates(tmp_path, request, now + dt.timedelta(days=3625))
    assert late_ca.ca_created and late_ca.serving_issued
    assert late_ca.ca.cert != first.ca.cert
    assert "CA expires within 30 days" in late_ca.report[0]
    # A leaf never outlives the CA that signs it.
    assert late_ca.serving_cert.not_valid_after_utc <= late_ca.ca.cert.not_valid_after_utc
    verify_chain(tmp_path, now=now + dt.timedelta(days=3625))


def test_different_service_reissues_leaf_with_new_names(capsys, tmp_path):
    run_certs(capsys, tmp_path)
    ca_before = (tmp_path / "ca.crt").read_bytes()

    code = main(["certs", "--service", "gate", "--namespace", "jobs", "--out-dir", str(tmp_path)])

    err = capsys.readouterr().err
    assert code == 0
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    assert "names differ" in err
    verify_chain(tmp_path, hostname="gate.jobs.svc")
    leaf = read_cert(tmp_path / "tls.crt")
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == list(service_dns_names("gate", "jobs"))


def test_leaf_from_another_ca_is_reissued_under_the_current_one(capsys, tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    run_certs(capsys, mine)
    run_certs(capsys, theirs)
    shutil.copy(theirs / "ca.crt", mine / "ca.crt")
    shutil.copy(theirs / "ca.key", mine / "ca.key")

    code, _, err = run_certs(capsys, mine)

    assert code == 0
    assert "kept CA" in err and "not signed by the current CA" in err
    assert verify_chain(mine)[-1] == read_cert(theirs / "ca.crt")


def test_ca_key_that_does_not_match_is_replaced_with_a_new_ca(capsys, tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    run_certs(capsys, mine)
    run_certs(capsys, theirs)
    old_ca = (mine / "ca.crt").read_bytes()
    shutil.copy(theirs / "ca.key", mine / "ca.key")

    code, _, err = run_certs(capsys, mine)

    assert code == 0
    assert "ca.key does not match ca.crt" in err
    assert (mine / "ca.crt").read_bytes() != old_ca
    verify_chain(mine)


def test_switching_key_type_reissues_leaf_only(capsys, tmp_path):
    run_certs(capsys, tmp_path)
    ca_before = (tmp_path / "ca.crt").read_bytes()

    code, _, err = run_certs(capsys, tmp_path, "--key", "rsa")

    assert code == 0 and "key is not rsa" in err
    assert (tmp_path / "ca.crt").read_bytes() == ca_before
    assert isinstance(read_cert(tmp_path / "tls.crt").public_key(), rsa.RSAPublicKey)
    verify_chain(tmp_path)


# --- bad input --------------------------------------------------------------------------------


def test_corrupt_ca_certificate_is_a_one_line_error_naming_it(capsys, tmp_path):
    run_certs(capsys, tmp_path)
    (tmp_path / "ca.crt").write_text("not a certificate\n")

    code, out, err = run_certs(capsys, tmp_path)

    assert code == 2
    assert err.count("\n") == 1 and str(tmp_path / "ca.crt") in err
    assert "Traceback" not in err and out == ""
    assert (tmp_path / "ca.crt").read_text() == "not a certificate\n"  # left for the user to fix


def test_unreadable_ca_certificate_is_a_one_line_error_naming_it(capsys, tmp_path):
    (tmp_path / "ca.crt").mkdir()  # unreadable as a file, even for root

    code, _, err = run_certs(capsys, tmp_path)

    assert code == 2
    assert err.count("\n") == 1 and f"{tmp_path / 'ca.crt'}: cannot read" in err


def test_corrupt_serving_key_is_a_one_line_error_naming_it(capsys, tmp_path):
    run_certs(capsys, tmp_path)
    (tmp_path / "tls.key").write_text("-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")

    code, _, err = run_certs(capsys, tmp_path)

    assert code == 2 and err.count("\n") == 1 and str(tmp_path / "tls.key") in err


def test_ca_file_alone_gets_a_new_ca_because_its_key_is_gone(capsys, tmp_path):
    run_certs(capsys, tmp_path)
    (tmp_path / "ca.key").unlink()

    code, _, err = run_certs(capsys, tmp_path)

    assert code == 0 and "(ca.key is missing)" in err
    verify_chain(tmp_path)


@pytest.mark.parametrize(
    "args, field",
    [
        (["--service", "Bad_Name", "--namespace", NAMESPACE], "--service"),
        (["--service", SERVICE, "--namespace", "Ops"], "--namespace"),
        (["--service", SERVICE, "--namespace", NAMESPACE, "--days", "0"], "--days"),
        (["--service", SERVICE, "--namespace", NAMESPACE, "--days", "20"], "--renew-before"),
        (["--service", SERVICE, "--namespace", NAMESPACE, "--secret-name", "No/Good"], "--secret-name"),
    ],
)
def test_bad_options_are_usage_errors_naming_the_option(capsys, tmp_path, args, field):
    code = main(["certs", "--out-dir", str(tmp_path / "out"), *args])

    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and field in err
    assert not (tmp_path / "out").exists()


# --- manifests --------------------------------------------------------------------------------


def test_secret_is_a_tls_secret_carrying_the_files(capsys, tmp_path):
    code, out, _ = run_certs(capsys, tmp_path, "--secret")

    assert code == 0
    secret = yaml.safe_load(out)
    assert secret["apiVersion"] == "v1" and secret["kind"] == "Secret"
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"] == {"name": f"{SERVICE}-tls", "namespace": NAMESPACE}
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == {
        "tls.crt": (tmp_path / "tls.crt").read_bytes(),
        "tls.key": (tmp_path / "tls.key").read_bytes(),
        "ca.crt": (tmp_path / "ca.crt").read_bytes(),
    }


def test_secret_name_can_be_chosen(capsys, tmp_path):
    _, out, _ = run_certs(capsys, tmp_path, "--secret", "--secret-name", "webhook-serving")

    assert yaml.safe_load(out)["metadata"]["name"] == "webhook-serving"


MANIFESTS = """\
# rendered by helm template
apiVersion: v1
kind: Service  # this comment must survive
metadata: {name: preflight, namespace: ops}
spec:
  ports: [{port: 443, targetPort: 8443}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: preflight
webhooks:
- name: jobs.preflight.example.com
  clientConfig:
    service: {name: preflight, namespace: ops, path: /validate}
  sideEffects: None
  admissionReviewVersions: [v1]
- name: pods.preflight.example.com
  clientConfig:
    service: {name: preflight, namespace: ops, path: /validate}
    caBundle: b2xk
  sideEffects: None
  admissionReviewVersions: [v1]
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: defaults
webhooks:
- name: defaults.preflight.example.com
  clientConfig:
    service: {name: preflight, namespace: ops}
  sideEffects: None
  admissionReviewVersions: [v1]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: preflight, namespace: ops}
"""


def test_patch_webhook_sets_ca_bundle_everywhere_and_keeps_other_documents(capsys, tmp_path):
    manifest = tmp_path / "webhook.yaml"
    manifest.write_text(MANIFESTS)
    manifest.chmod(0o640)

    code, _, err = run_certs(capsys, tmp_path / "certs", "--patch-webhook", str(manifest))

    assert code == 0, err
    ca_bundle = base64.b64encode((tmp_path / "certs" / "ca.crt").read_bytes()).decode()
    documents = list(yaml.safe_load_all(manifest.read_text()))
    original = list(yaml.safe_load_all(MANIFESTS))
    assert [d["kind"] for d in documents] == [d["kind"] for d in original]
    hooks = documents[1]["webhooks"] + documents[2]["webhooks"]
    assert len(hooks) == 3
    assert all(hook["clientConfig"]["caBundle"] == ca_bundle for hook in hooks)
    for hook in hooks:
        del hook["clientConfig"]["caBundle"]
    for hook in original[1]["webhooks"] + original[2]["webhooks"]:
        hook["clientConfig"].pop("caBundle", None)
    assert documents == original  # nothing but caBundle changed
    text = manifest.read_text()
    assert text.startswith(MANIFESTS.split("---\n")[0])  # untouched text, comments included
    assert text.endswith(MANIFESTS.split("---\n")[-1])
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o640
    assert f"set caBundle on 3 webhooks in 2 configurations in {manifest}" in err
    assert "warning" not in err


def test_patch_webhook_on_single_configuration_warns_about_other_service(capsys, tmp_path):
    manifest = tmp_path / "vwc.yaml"
    manifest.write_text(
        "apiVersion: admissionregistration.k8s.io/v1\n"
        "kind: ValidatingWebhookConfiguration\n"
        "metadata: {name: preflight}\n"
        "webhooks:\n"
        "- name: jobs.preflight.example.com\n"
        "  clientConfig: {service: {name: elsewhere, namespace: ops}}\n"
    )

    code, _, err = run_certs(capsys, tmp_path / "certs", "--patch-webhook", str(manifest))

    assert code == 0
    document = yaml.safe_load(manifest.read_text())
    ca_pem = (tmp_path / "certs" / "ca.crt").read_bytes()
    assert base64.b64decode(document["webhooks"][0]["clientConfig"]["caBundle"]) == ca_pem
    assert "warning" in err and "elsewhere.ops" in err


@pytest.mark.parametrize(
    "content, message",
    [
        ("kind: ConfigMap\nmetadata: {name: x}\n", "no ValidatingWebhookConfiguration"),
        ("kind: ValidatingWebhookConfiguration\nwebhooks: [\n", "not valid YAML"),
        (
            "kind: ValidatingWebhookConfiguration\nmetadata: {name: v}\nwebhooks:\n- name: a\n",
            "document 1 (ValidatingWebhookConfiguration v): webhooks[0].clientConfig",
        ),
    ],
)
def test_patch_webhook_errors_name_the_file_and_leave_it_alone(capsys, tmp_path, content, message):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(content)

    code, _, err = run_certs(capsys, tmp_path / "certs", "--patch-webhook", str(manifest))

    (error,) = err.splitlines()  # decided before anything is written: no certificate reported
    assert code == 2
    assert error.startswith(f"image-preflight certs: {manifest}: ") and message in error
    assert manifest.read_text() == content
    assert not (tmp_path / "certs").exists()


def test_patch_webhook_missing_file_fails_before_writing_certificates(capsys, tmp_path):
    code, _, err = run_certs(capsys, tmp_path / "certs", "--patch-webhook", str(tmp_path / "absent.yaml"))

    assert code == 2 and str(tmp_path / "absent.yaml") in err
    assert not (tmp_path / "certs").exists()



@pytest.mark.parametrize("flag, value, said", [
    ("--days", "3000000", "--days 3000000: must be 36500 (100 years) or less"),
    ("--days", "99999999999999", "--days 99999999999999: must be 36500 (100 years) or less"),
    ("--ca-days", "99999999999999", "--ca-days 99999999999999: must be 36500 (100 years) or less"),
    ("--renew-before", "99999999999999", "--renew-before 99999999999999: must be 36500 (100 years) or less"),
])
def test_a_lifetime_past_a_hundred_years_is_refused_in_one_line_and_writes_nothing(capsys, tmp_path, flag, value,
                                                                                   said):
    code, out, err = run_certs(capsys, tmp_path / "certs", flag, value)

    assert (code, out, err) == (2, "", f"image-preflight certs: {said}\n")
    assert not (tmp_path / "certs").exists()


@pytest.mark.parametrize("lifetimes", [{"days": 3_000_000}, {"ca_days": 3_000_000}, {"days": 10**12}])
def test_a_certificate_that_cannot_be_made_leaves_the_folder_as_it_was(tmp_path, lifetimes):
    """All four files are decided before any is written: a CA is not left without its serving pair."""
    with pytest.raises(InputError, match=r"^.*: --(ca-)?days \d+: the certificate would end after 9999-12-31$"):
        ensure_certificates(tmp_path, CertRequest(SERVICE, NAMESPACE, **lifetimes), dt.datetime.now(dt.timezone.utc))
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_written_leaves_the_others_unwritten_too(capsys, tmp_path, monkeypatch):
    synced = []

    def fsync(fd: int) -> None:  # the third of the four files finds the disk full
        synced.append(fd)
        if len(synced) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    code, _, err = run_certs(capsys, tmp_path)

    assert code == 2 and err.count("\n") == 1 and err.endswith(": cannot write (No space left on device)\n"), err
    assert list(tmp_path.iterdir()) == []
