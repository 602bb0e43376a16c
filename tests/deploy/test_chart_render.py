"""Every ci/ case of the Helm chart (deploy/chart/image-preflight): `helm lint --strict` passes, its
objects are named, namespaced and labelled, validate against the Kubernetes schema (cert-manager's
and the Prometheus Operator's field by field) and pass checkov, and Helm 4 renders what Helm 3 does.

`helm` and `helm4` come from tests/controlplane/build (tests/chart.py); checkov runs from its own
virtualenv (`.venv-tools`, or $CHECKOV, or PATH). Either one absent skips its tests with the
reason, or fails them when $CI is set. The server-side dry run on the real apiserver is
tests/cluster/test_cluster_chart.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from tests.builders.chart_objects import CERT_MANAGER, MONITORING, api_group
from tests.chart import CASES, CHART, NAMESPACE, SERVICE, case_file, helm_binary, template
from tests.deploy.rendered import K8S_VERSION, _docs, _one, _rendered
from tests.needs import unavailable
from tests.release import ROOT

# Custom resources have no schema in kubernetes-validate; every such group needs a line here
# (CERT_MANAGER's, from tests/builders/chart_objects.py, is checked by cert_manager_problems() below).
UNVALIDATED_GROUPS = {"image-preflight.io": "the node agent's own resources; their CRD is validated"}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "CustomResourceDefinition", "PriorityClass", "RuntimeClass", "StorageClass", "ClusterIssuer",
    "NodeImages",
}


@pytest.fixture(scope="session")
def checkov() -> str:
    candidates = [os.environ.get("CHECKOV"), str(ROOT / ".venv-tools" / "bin" / "checkov"), shutil.which("checkov")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    unavailable("checkov not found ($CHECKOV, .venv-tools/bin/checkov, PATH); see .ci/run")


# --- cert-manager: no schema ships with kubernetes-validate, so the fields our manifests use ---

_GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_CERTIFICATE_FIELDS = {
    "additionalOutputFormats", "commonName", "dnsNames", "duration", "emailAddresses",
    "encodeUsagesInRequest", "ipAddresses", "isCA", "issuerRef", "keystores", "literalSubject",
    "nameConstraints", "otherNames", "privateKey", "renewBefore", "renewBeforePercentage",
    "revisionHistoryLimit", "secretName", "secretTemplate", "signatureAlgorithm", "subject", "uris", "usages",
}
_SUBJECT_FIELDS = ("commonName", "dnsNames", "ipAddresses", "uris", "emailAddresses", "literalSubject", "otherNames")
_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
    "client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel",
    "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
}
_ISSUER_TYPES = {"acme", "ca", "selfSigned", "vault", "venafi"}


def cert_manager_problems(document: dict) -> list[str]:
    kind, spec = document["kind"], document.get("spec")
    where = f"{kind} {document['metadata'].get('name')}"
    if document["apiVersion"] != "cert-manager.io/v1":
        return [f"{where}: apiVersion {document['apiVersion']} is not cert-manager.io/v1"]
    if not isinstance(spec, dict):
        return [f"{where}: spec is missing"]
    if kind in ("Issuer", "ClusterIssuer"):
        types = set(spec) & _ISSUER_TYPES
        problems = [f"{where}: unknown field spec.{f}" for f in sorted(set(spec) - _ISSUER_TYPES)]
        if len(types) != 1:
            problems.append(f"{where}: needs exactly one of {sorted(_ISSUER_TYPES)}, has {sorted(types)}")
        if "ca" in spec and not isinstance((spec["ca"] or {}).get("secretName"), str):
            problems.append(f"{where}: spec.ca.secretName is missing")
        return problems
    if kind != "Certificate":
        return [f"{where}: kind not checked here; add it to cert_manager_problems()"]
    problems = [f"{where}: unknown field spec.{f}" for f in sorted(set(spec) - _CERTIFICATE_FIELDS)]
    if not isinstance(spec.get("secretName"), str):
        problems.append(f"{where}: spec.secretName is missing")
    if not any(spec.get(f) for f in _SUBJECT_FIELDS):
        problems.append(f"{where}: names no subject ({', '.join(_SUBJECT_FIELDS)})")
    issuer = spec.get("issuerRef") or {}
    if set(issuer) - {"name", "kind", "group"} or not isinstance(issuer.get("name"), str):
        problems.append(f"{where}: spec.issuerRef needs name (and only kind, group)")
    if issuer.get("kind", "Issuer") not in ("Issuer", "ClusterIssuer") \
            and issuer.get("group", CERT_MANAGER) == CERT_MANAGER:
        problems.append(f"{where}: spec.issuerRef.kind {issuer.get('kind')!r} is not Issuer or ClusterIssuer")
    for field in ("duration", "renewBefore"):
        if field in spec and not _GO_DURATION.match(str(spec[field])):
            problems.append(f"{where}: spec.{field} {spec[field]!r} is not a Go duration")
    problems += [f"{where}: unknown usage {u!r}" for u in spec.get("usages", []) if u not in _USAGES]
    key = spec.get("privateKey") or {}
    if set(key) - {"algorithm", "encoding", "rotationPolicy", "size"}:
        problems.append(f"{where}: unknown field in spec.privateKey: {sorted(set(key))}")
    if key.get("algorithm", "RSA") not in ("RSA", "ECDSA", "Ed25519"):
        problems.append(f"{where}: spec.privateKey.algorithm {key['algorithm']!r}")
    if key.get("rotationPolicy", "Always") not in ("Never", "Always"):
        problems.append(f"{where}: spec.privateKey.rotationPolicy {key['rotationPolicy']!r}")
    if "isCA" in spec and not isinstance(spec["isCA"], bool):
        problems.append(f"{where}: spec.isCA is not a boolean")
    return problems


# --- the Prometheus Operator's ServiceMonitor: no schema in kubernetes-validate either ---

_ENDPOINT_FIELDS = {"port", "path", "interval", "scheme", "scrapeTimeout", "tlsConfig", "honorLabels",
                    "relabelings", "metricRelabelings", "bearerTokenSecret", "authorization"}


def service_monitor_problems(document: dict) -> list[str]:
    """monitoring.coreos.com/v1 ServiceMonitor: the fields the chart's uses."""
    where = f"{document['kind']} {document['metadata'].get('name')}"
    if (document["apiVersion"], document["kind"]) != (f"{MONITORING}/v1", "ServiceMonitor"):
        return [f"{where}: {document['apiVersion']} is not {MONITORING}/v1 ServiceMonitor"]
    spec = document.get("spec") or {}
    problems = [f"{where}: unknown field spec.{f}" for f in sorted(set(spec) - {
        "selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"})]
    if not isinstance((spec.get("selector") or {}).get("matchLabels"), dict):
        problems.append(f"{where}: spec.selector.matchLabels is missing")
    if not spec.get("endpoints"):
        problems.append(f"{where}: spec.endpoints is empty")
    for n, endpoint in enumerate(spec.get("endpoints") or ()):
        problems += [f"{where}: unknown field spec.endpoints[{n}].{f}"
                     for f in sorted(set(endpoint) - _ENDPOINT_FIELDS)]
        if "interval" in endpoint and not _GO_DURATION.match(str(endpoint["interval"])):
            problems.append(f"{where}: spec.endpoints[{n}].interval {endpoint['interval']!r} is not a duration")
    return problems


def _problems_of(document: dict) -> list[str] | None:
    """The field checks of a group kubernetes-validate has no schema for; None for the others."""
    group = api_group(document)
    if group == CERT_MANAGER:
        return cert_manager_problems(document)
    if group == MONITORING:
        return service_monitor_problems(document)
    return None


@pytest.mark.parametrize("case", CASES)
def test_helm_lint_strict_passes(case):
    done = subprocess.run([helm_binary(), "lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                           "--values", str(case_file(case))], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize("case", CASES)
def test_renders_named_and_namespaced_objects(case):
    documents = _docs(case)
    assert documents, f"ci/{case}-values.yaml renders nothing"
    for document in documents:
        assert {"apiVersion", "kind", "metadata"} <= set(document), document
        metadata = document["metadata"]
        assert metadata.get("name"), f"{case}: a {document['kind']} without a name"
        # Otherwise it lands in whatever namespace the applying kubectl context points at.
        if document["kind"] not in CLUSTER_SCOPED:
            assert metadata.get("namespace"), f"{case}: {document['kind']} {metadata['name']} has no namespace"
        assert metadata.get("labels", {}).get("app.kubernetes.io/part-of") == "image-preflight" or \
            document["kind"] == "CustomResourceDefinition", f"{case}: {document['kind']} {metadata['name']} unlabelled"


@pytest.mark.parametrize("case", CASES)
def test_validates_against_the_kubernetes_schema(case):
    problems = []
    for document in _docs(case):
        name = f"{document['kind']} {document['metadata']['name']}"
        found = _problems_of(document)
        if found is not None:
            problems += found
            continue
        if api_group(document) in UNVALIDATED_GROUPS:
            continue
        try:
            kubernetes_validate.validate(document, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{name}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{name}: {exc.message}; a custom resource's group needs an entry in UNVALIDATED_GROUPS")
    assert not problems, f"ci/{case}-values.yaml against Kubernetes {K8S_VERSION}:\n" + "\n".join(problems)


def _checkov_reports(stdout: str) -> list[dict]:
    data = json.loads(stdout)
    return data if isinstance(data, list) else [data]


@pytest.mark.parametrize("case", CASES)
def test_checkov_finds_nothing_unexplained(checkov, case, tmp_path):
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(_rendered(case)[0], encoding="utf-8")
    # Comments do not survive rendering: skips are `checkov.io/skipN: CHECK=reason` annotations.
    result = subprocess.run(
        [checkov, "-f", str(manifest), "--framework", "kubernetes", "--skip-download", "-o", "json", "--compact"],
        capture_output=True, text=True, check=False,
    )
    try:
        reports = _checkov_reports(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov exited {result.returncode} without a JSON report: {result.stderr.strip()[-2000:]}")
    scanned = sum(r.get("summary", {}).get("resource_count", 0) for r in reports)
    assert scanned > 0, f"checkov scanned no resource in ci/{case}-values.yaml"
    failed, unexplained = [], []
    for report in reports:
        assert report.get("summary", {}).get("parsing_errors", 0) == 0, report["summary"]
        results = report.get("results", {})
        failed += [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in results.get("failed_checks", [])]
        for check in results.get("skipped_checks", []):
            reason = check["check_result"].get("suppress_comment", "").strip()
            if not reason or reason == "No comment provided":
                unexplained.append(f"{check['check_id']} {check['resource']}")
    assert not failed, f"ci/{case}-values.yaml: checkov failed checks:\n" + "\n".join(failed)
    assert not unexplained, f"ci/{case}-values.yaml: skipped without a reason: {unexplained}"


@pytest.mark.parametrize("case", CASES)
def test_helm_4_renders_the_same_objects(case):
    """Helm 4 (helm.sh/helm/v4, from its Go module) renders what Helm 3 does. Generated keys and
    certificates differ on every render, and Helm 4 labels its own version: both left out."""
    def comparable(helm: str) -> list[dict]:
        text = template(case=case, helm=helm).stdout
        found = [_without_generated(d) for d in yaml.safe_load_all(text) if d]
        # The order of a file's objects is Helm's own (4 sorts them otherwise), not the chart's.
        return sorted(found, key=lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]))

    assert comparable("helm4") == comparable("helm")


def _without_generated(document: dict) -> dict:
    document = json.loads(json.dumps(document))
    if document["kind"] == "Secret":
        document["data"] = sorted(document.get("data", {}))
        document["metadata"].get("annotations", {}).pop("image-preflight.io/not-after", None)
    for hook in document.get("webhooks", ()):
        hook.get("clientConfig", {}).pop("caBundle", None)
    return document


def test_strict_schema_catches_a_misspelt_field():
    deployment = _one(_docs("default"), "Deployment", SERVICE)
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    deployment = json.loads(json.dumps(deployment))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "IfNotPresent"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_cert_manager_check_catches_broken_certificates():
    spec = {"secretName": "s", "dnsNames": ["a.b.svc"], "issuerRef": {"name": "i"}}
    certificate = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "c"}}
    assert cert_manager_problems({**certificate, "spec": spec}) == []
    without_secret = {k: v for k, v in spec.items() if k != "secretName"}
    for broken in (
        without_secret | {"secretNme": "s"}, spec | {"duration": "90d"}, spec | {"usages": ["server-auth"]},
        spec | {"dnsNames": []}, spec | {"privateKey": {"algorithm": "ecdsa"}},
        spec | {"issuerRef": {"kind": "Issuer"}},
    ):
        assert cert_manager_problems({**certificate, "spec": broken}), broken
    issuer = {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": {"name": "i"}}
    assert cert_manager_problems({**issuer, "spec": {"selfSigned": {}}}) == []
    assert cert_manager_problems({**issuer, "spec": {"selfSigned": {}, "ca": {"secretName": "x"}}})
    assert cert_manager_problems({**issuer, "spec": {"ca": {}}})


def test_service_monitor_check_catches_a_broken_one():
    (monitor,) = [d for d in _docs("everything") if d["kind"] == "ServiceMonitor"]
    assert service_monitor_problems(monitor) == []
    for broken in ({"endpoints": []}, {"selector": {}}, {"endpoints": [{"port": "metrics", "intervall": "5s"}]},
                   {"endpoints": [{"port": "metrics", "interval": "5 s"}]}):
        assert service_monitor_problems({**monitor, "spec": {**monitor["spec"], **broken}}), broken
