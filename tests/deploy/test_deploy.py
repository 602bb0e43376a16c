"""deploy/: every kustomization renders, validates against the Kubernetes schema, passes checkov,
and does what docs/deploy.md promises (fail-open, opt-in namespaces, read-only RBAC, hardening).

`kubectl` renders (the `render` fixture, tests/conftest.py); checkov runs from its own virtualenv
(`.venv-tools`, or $CHECKOV, or PATH). Either one absent skips its tests with the reason, or fails
them when $CI is set. The server-side dry run on the real apiserver is tests/cluster/test_cluster_deploy.py.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from kubernetes_validate.utils import latest_version

from image_preflight.cli import build_parser
from image_preflight.doctor.findings import selects as selector_matches  # metav1.LabelSelector
from image_preflight.core.decide.decision import DENY, decide
from image_preflight.core.image_gc.pinning import NEEDED_CONFIGMAP, NEEDED_NAME, NEEDED_NAMESPACE
from image_preflight.files.inventory import load_inventory_file
from image_preflight.core.decide.workloads import pod_spec_of
from tests.agent_lightning import build_job_spec, example_row
from tests.needs import unavailable
from tests.builders import CERT_MANAGER, EXAMPLES, NAMESPACE, SELF_SIGNED, SERVICE, TARGETS, api_group

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK = "validate.image-preflight.io"
K8S_VERSION = latest_version()
# Custom resources have no schema in kubernetes-validate; every such group needs a line here
# (CERT_MANAGER's, from tests/builders.py, is checked by cert_manager_problems() below).
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


def _docs(render, target: str) -> list[dict]:
    return render(target)[1]


def _one(documents: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _webhook(documents: list[dict]) -> dict:
    configuration = _one(documents, "ValidatingWebhookConfiguration", "image-preflight")
    (hook,) = [h for h in configuration["webhooks"] if h["name"] == WEBHOOK]
    return hook


def _pod_spec(documents: list[dict]) -> dict:
    return _one(documents, "Deployment", "image-preflight")["spec"]["template"]["spec"]


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
    if issuer.get("kind", "Issuer") not in ("Issuer", "ClusterIssuer") and issuer.get("group", CERT_MANAGER) == CERT_MANAGER:
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


# --- every kustomization -------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_renders_named_and_namespaced_objects(render, target):
    documents = _docs(render, target)
    assert documents, f"deploy/{target} renders nothing"
    for document in documents:
        assert {"apiVersion", "kind", "metadata"} <= set(document), document
        metadata = document["metadata"]
        assert metadata.get("name"), f"deploy/{target}: a {document['kind']} without a name"
        # Otherwise it lands in whatever namespace the applying kubectl context points at.
        if document["kind"] not in CLUSTER_SCOPED:
            assert metadata.get("namespace"), f"deploy/{target}: {document['kind']} {metadata['name']} has no namespace"


@pytest.mark.parametrize("target", TARGETS)
def test_validates_against_the_kubernetes_schema(render, target):
    problems = []
    for document in _docs(render, target):
        name = f"{document['kind']} {document['metadata']['name']}"
        group = api_group(document)
        if group == CERT_MANAGER:
            problems += cert_manager_problems(document)
            continue
        if group in UNVALIDATED_GROUPS:
            continue
        try:
            kubernetes_validate.validate(document, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{name}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{name}: {exc.message}; a custom resource's group needs an entry in UNVALIDATED_GROUPS")
    assert not problems, f"deploy/{target} against Kubernetes {K8S_VERSION}:\n" + "\n".join(problems)


def _checkov_reports(stdout: str) -> list[dict]:
    data = json.loads(stdout)
    return data if isinstance(data, list) else [data]


@pytest.mark.parametrize("target", TARGETS)
def test_checkov_finds_nothing_unexplained(render, checkov, target, tmp_path):
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(render(target)[0], encoding="utf-8")
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
    assert scanned > 0, f"checkov scanned no resource in deploy/{target}"
    failed, unexplained = [], []
    for report in reports:
        assert report.get("summary", {}).get("parsing_errors", 0) == 0, report["summary"]
        results = report.get("results", {})
        failed += [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in results.get("failed_checks", [])]
        for check in results.get("skipped_checks", []):
            reason = check["check_result"].get("suppress_comment", "").strip()
            if not reason or reason == "No comment provided":
                unexplained.append(f"{check['check_id']} {check['resource']}")
    assert not failed, f"deploy/{target}: checkov failed checks:\n" + "\n".join(failed)
    assert not unexplained, f"deploy/{target}: skipped without a reason: {unexplained}"


def test_strict_schema_catches_a_misspelt_field(render):
    deployment = _one(_docs(render, "base"), "Deployment")
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
        spec | {"dnsNames": []}, spec | {"privateKey": {"algorithm": "ecdsa"}}, spec | {"issuerRef": {"kind": "Issuer"}},
    ):
        assert cert_manager_problems({**certificate, "spec": broken}), broken
    issuer = {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": {"name": "i"}}
    assert cert_manager_problems({**issuer, "spec": {"selfSigned": {}}}) == []
    assert cert_manager_problems({**issuer, "spec": {"selfSigned": {}, "ca": {"secretName": "x"}}})
    assert cert_manager_problems({**issuer, "spec": {"ca": {}}})


# --- the base --------------------------------------------------------------------------------


def test_webhook_fails_open_quickly_without_side_effects(render):
    hook = _webhook(_docs(render, "base"))
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 5
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert "objectSelector" not in hook


def test_webhook_sees_jobs_and_pods_on_create_and_update(render):
    rules = {
        (tuple(r["apiGroups"]), tuple(r["apiVersions"]), tuple(r["resources"])): set(r["operations"])
        for r in _webhook(_docs(render, "base"))["rules"]
    }
    assert rules == {(("batch",), ("v1",), ("jobs",)): {"CREATE", "UPDATE"}, (("",), ("v1",), ("pods",)): {"CREATE", "UPDATE"}}


def test_webhook_reaches_the_server_through_the_service(render):
    documents = _docs(render, "base")
    service_ref = _webhook(documents)["clientConfig"]["service"]
    assert service_ref == {"name": SERVICE, "namespace": NAMESPACE, "path": "/validate", "port": 443}
    service = _one(documents, "Service", SERVICE)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == 443]
    container = _pod_spec(documents)["containers"][0]
    by_name = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert by_name[port["targetPort"]] == 8443
    assert selector_matches({"matchLabels": service["spec"]["selector"]},
                            _one(documents, "Deployment")["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize(
    ("labels", "enforced"),
    [
        ({"kubernetes.io/metadata.name": "default"}, False),
        ({"kubernetes.io/metadata.name": "rollouts", "image-preflight.io/enforce": "true"}, True),
        ({"kubernetes.io/metadata.name": "rollouts", "image-preflight.io/enforce": "false"}, False),
        ({"kubernetes.io/metadata.name": "kube-system", "image-preflight.io/enforce": "true"}, False),
        ({"kubernetes.io/metadata.name": NAMESPACE, "image-preflight.io/enforce": "true"}, False),
    ],
)
def test_enforcement_is_opt_in_and_spares_system_namespaces(render, labels, enforced):
    assert selector_matches(_webhook(_docs(render, "base"))["namespaceSelector"], labels) is enforced


def test_cluster_role_only_reads_nodes_node_images_and_runtime_classes(render):
    documents = _docs(render, "base")
    rules = _one(documents, "ClusterRole", "image-preflight")["rules"]
    granted = {(group, resource): set(rule["verbs"]) for rule in rules for group in rule["apiGroups"] for resource in rule["resources"]}
    assert granted == {("", "nodes"): {"list", "watch"}, ("image-preflight.io", "nodeimages"): {"list", "watch"},
                       ("node.k8s.io", "runtimeclasses"): {"list", "watch"}}
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in rules)
    assert not [d for d in documents if d["kind"] in ("Role", "RoleBinding")]
    binding = _one(documents, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "image-preflight"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "image-preflight", "namespace": NAMESPACE}]
    assert _pod_spec(documents)["serviceAccountName"] == "image-preflight"


def test_deployment_is_hardened(render):
    spec = _pod_spec(_docs(render, "base"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] > 0
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    for bound in ("requests", "limits"):
        assert set(container["resources"][bound]) == {"cpu", "memory"}
    assert spec["automountServiceAccountToken"] is True  # in-cluster credentials for the watch


def test_deployment_runs_two_spread_replicas_of_this_version(render):
    documents = _docs(render, "base")
    deployment = _one(documents, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    spec = deployment["spec"]["template"]["spec"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert selector_matches(spread["labelSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    container = spec["containers"][0]
    assert container["image"] == f"image-preflight:{version}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    probes = {name: container[name]["httpGet"] for name in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
    assert {p["scheme"] for p in probes.values()} == {"HTTPS"}
    budget = _one(documents, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert selector_matches(budget["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])


def test_deployment_arguments_are_valid_serve_flags_reading_the_mounted_secret(render):
    spec = _pod_spec(_docs(render, "base"))
    container = spec["containers"][0]
    args = build_parser()[0].parse_args(["serve", *container["args"]])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    assert args.tls_cert == Path(mount["mountPath"]) / "tls.crt"
    assert args.tls_key == Path(mount["mountPath"]) / "tls.key"
    assert args.port == 8443
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == f"{SERVICE}-tls"  # `image-preflight certs --secret`'s name


def test_dockerfile_matches_the_deployment(render):
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    context = _pod_spec(_docs(render, "base"))["containers"][0]["securityContext"]
    # The base users pull by default; a build without a registry names a local one.
    assert re.search(r"^ARG BASE=python:3\.11-slim$", dockerfile, re.M) and re.search(r"^FROM \$\{BASE\}$", dockerfile, re.M)
    assert re.search(rf"^USER {context['runAsUser']}:{context['runAsGroup']}$", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["image-preflight", "serve"\]$', dockerfile, re.M)
    admitted = {line[1:].strip("/") for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines() if line.startswith("!")}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {setuptools.get("package-dir", {}).get(p, p.replace(".", "/")).split("/")[0] for p in setuptools["packages"]}
    assert folders | {"pyproject.toml", "README.md"} <= admitted


# --- overlays and components ---------------------------------------------------------------


def test_self_signed_overlay_carries_the_generated_ca_and_certificate(render, deploy_copy):
    documents = _docs(render, SELF_SIGNED)
    certs = deploy_copy / SELF_SIGNED / "certs"
    ca_pem = (certs / "ca.crt").read_bytes()
    ca_bundle = _webhook(documents)["clientConfig"]["caBundle"]
    assert base64.b64decode("".join(ca_bundle.split())) == ca_pem
    secret = _one(documents, "Secret", f"{SERVICE}-tls")
    assert secret["metadata"]["namespace"] == NAMESPACE
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode("".join(v.split())) for k, v in secret["data"].items()}
    assert data == {name: (certs / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt")}
    serving = x509.load_pem_x509_certificate(data["tls.crt"])
    serving.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{SERVICE}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    volume = [v for v in _pod_spec(documents)["volumes"] if v["name"] == "tls"][0]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]


def test_cert_manager_overlay_issues_the_mounted_secret_and_injects_its_ca(render):
    documents = _docs(render, "overlays/cert-manager")
    configuration = _one(documents, "ValidatingWebhookConfiguration")
    assert "caBundle" not in _webhook(documents)["clientConfig"]  # cainjector owns it
    namespace, name = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    serving = _one(documents, "Certificate", name)
    assert serving["metadata"]["namespace"] == namespace == NAMESPACE
    assert f"{SERVICE}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    volume = [v for v in _pod_spec(documents)["volumes"] if v["name"] == "tls"][0]
    assert serving["spec"]["secretName"] == volume["secret"]["secretName"]
    assert not [d for d in documents if d["kind"] == "Secret"]  # cert-manager writes it

    # serving <- CA Issuer <- CA Certificate <- self-signed Issuer, all in the namespace
    issuers = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Issuer"}
    certificates = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Certificate"}
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    (ca_certificate,) = [c for c in certificates.values() if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]]
    assert ca_certificate["spec"]["isCA"] is True
    assert "selfSigned" in issuers[ca_certificate["spec"]["issuerRef"]["name"]]["spec"]
    assert all(d["metadata"]["namespace"] == NAMESPACE for d in [*issuers.values(), *certificates.values()])


def _differences_from_base(render, target: str) -> dict:
    base, changed = _webhook(_docs(render, "base")), _webhook(_docs(render, target))
    return {k: changed.get(k) for k in set(base) | set(changed) if base.get(k) != changed.get(k)}


def test_agentlightning_only_component_matches_agentlightnings_jobs_and_their_pods(render):
    """build_job_spec labels the Job, not its Pods (the real template labels them app: agl-rollout
    only), so the component matches Jobs by label and Pods by the job-name label the apiserver adds
    to every Job's template. Its behaviour is proved on a real control plane in
    tests/cluster/test_cluster_agentlightning.py; here, its shape."""
    target = "base+components/agentlightning-only"
    if target not in TARGETS:
        pytest.fail("deploy/components/agentlightning-only is missing")
    differences = _differences_from_base(render, target)
    assert set(differences) == {"matchConditions"}  # the rules and namespaceSelector stay the base's
    (condition,) = differences["matchConditions"]
    expression = " ".join(condition["expression"].split())
    assert expression.startswith("[object, oldObject].exists(o, o != null && has(o.metadata.labels) && (")
    assert ("'app.kubernetes.io/managed-by' in o.metadata.labels && "
            "o.metadata.labels['app.kubernetes.io/managed-by'] == 'agentlightning'") in expression
    assert ("'batch.kubernetes.io/job-name' in o.metadata.labels && "
            "o.metadata.labels['batch.kubernetes.io/job-name'].startsWith('agl-rollout-')") in expression
    job = yaml.safe_load((EXAMPLES / "missing-image-job.yaml").read_text(encoding="utf-8"))
    assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "agentlightning"
    assert job["metadata"]["name"].startswith("agl-rollout-")
    assert job["spec"]["template"]["metadata"]["labels"] == {"app": "agl-rollout"}


def test_failure_policy_fail_component_changes_only_the_policy(render):
    target = "base+components/failure-policy-fail"
    if target not in TARGETS:
        pytest.fail("deploy/components/failure-policy-fail is missing")
    assert _differences_from_base(render, target) == {"failurePolicy": "Fail"}


def test_steer_component_sends_pod_creates_to_mutate_like_the_validating_webhook(render):
    target = "base+components/steer"
    if target not in TARGETS:
        pytest.fail("deploy/components/steer is missing")
    documents = _docs(render, target)
    assert _differences_from_base(render, target) == {}  # the validating webhook is unchanged
    (hook,) = _one(documents, "MutatingWebhookConfiguration", "image-preflight")["webhooks"]
    validating = _webhook(documents)
    assert hook["clientConfig"] == {**validating["clientConfig"],
                                    "service": {**validating["clientConfig"]["service"], "path": "/mutate"}}
    assert hook["namespaceSelector"] == validating["namespaceSelector"]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["reinvocationPolicy"]) == ("Ignore", "None", "IfNeeded")
    assert hook["timeoutSeconds"] <= 3
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                              "operations": ["CREATE"], "scope": "Namespaced"}]
    args = build_parser()[0].parse_args(["serve", *_pod_spec(documents)["containers"][0]["args"]])
    assert args.steer
    base_roles = [d for d in _docs(render, "base") if d["kind"] in ("ClusterRole", "Role")]
    assert [d for d in documents if d["kind"] in ("ClusterRole", "Role")] == base_roles  # RBAC unchanged


def test_watchdog_component_runs_the_watchdog_on_the_webhooks_namespaces(render):
    target = "base+components/watchdog"
    if target not in TARGETS:
        pytest.fail("deploy/components/watchdog is missing")
    documents = _docs(render, target)
    deployment = _one(documents, "Deployment", "image-preflight-watchdog")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = build_parser()[0].parse_args([*container["command"][1:], *container["args"]])
    assert args.command == "watchdog" and args.mode == "enforce"
    # The watchdog's namespaces are the webhook's: its label selector is the namespaceSelector's label.
    key, value = args.namespace_selector.split("=")
    assert {"key": key, "operator": "In", "values": [value]} in _webhook(documents)["namespaceSelector"]["matchExpressions"]
    assert deployment["spec"]["replicas"] == 2
    binding = _one(documents, "ClusterRoleBinding", "image-preflight-watchdog")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"],
                                    "namespace": deployment["metadata"]["namespace"]}]
    assert container["securityContext"] == _pod_spec(documents)["containers"][0]["securityContext"]


# --- the walkthrough's example and document ---------------------------------------------------


def test_the_example_job_template_is_agent_lightnings_own():
    own = ROOT / "tests" / "data" / "agent-lightning" / "job-template-openai.yaml"
    assert (EXAMPLES / "job.yaml").read_text(encoding="utf-8") == own.read_text(encoding="utf-8")


def test_missing_image_job_is_what_agent_lightning_creates_and_the_example_node_would_deny():
    job = yaml.safe_load((EXAMPLES / "missing-image-job.yaml").read_text(encoding="utf-8"))
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    row = example_row("getmoto__moto.694ce1f4.func_pm_remove_cond__658cda14")
    rollout_id = job["metadata"]["labels"]["agentlightning/rollout-id"]
    rendered = build_job_spec((EXAMPLES / "job.yaml").read_text(), row, rollout_id=rollout_id, namespace=None)
    assert job == rendered
    decision = decide(pod_spec_of(job), load_inventory_file(EXAMPLES / "nodes.json"))
    assert decision.outcome == DENY
    # gpu-node-1 holds no rollout image but does not count: nvidia.com/gpu:NoSchedule keeps the Pod off.
    assert [v.missing_on for v in decision.verdicts] == [("cpu-node-1",)]


def _text_blocks(document: str) -> list[str]:
    return [" ".join(block.split()) for block in re.findall(r"```text\n(.*?)```", document, re.S)]


def test_the_docs_show_the_denial_the_example_job_gets():
    from image_preflight.core.admission.review import Settings, admit, parse_review

    review = parse_review((EXAMPLES / "admission-review.json").read_bytes())
    answer = admit(review, load_inventory_file(EXAMPLES / "nodes.json"), Settings()).review["response"]
    message = answer["status"]["message"]
    denial = f'admission webhook "{WEBHOOK}" denied the request: {message}'
    assert denial in _text_blocks((ROOT / "docs" / "agent-lightning.md").read_text(encoding="utf-8"))
    # The walkthrough's kind cluster has one node, preflight-control-plane.
    kind = 'Error from server: error when creating "examples/swe-smith/missing-image-job.yaml": ' + denial.replace(
        "cpu-node-1", "preflight-control-plane")
    assert kind in _text_blocks((ROOT / "docs" / "deploy.md").read_text(encoding="utf-8"))


def test_agent_lightning_doc_names_only_paths_that_exist():
    text = (ROOT / "docs" / "agent-lightning.md").read_text(encoding="utf-8")
    # examples/swe_smith/ and docs/NN-*.md are agent-lightning's own files; its links are to ours.
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples/swe-smith)/[\w./-]*\w", text)}
    named |= {f"docs/{m}" for m in re.findall(r"\]\(([\w-]+\.md)", text)}
    assert "deploy/agent" in named and "docs/agent.md" in named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/agent-lightning.md names paths that do not exist: {missing}"


def test_deploy_doc_names_only_paths_that_exist():
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "## The node agent" in text
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples)/[\w./-]*\w", text)}
    # certs/ is what `image-preflight certs` creates; deploy/agent is the node agent's, maintained apart.
    named = {p for p in named if not p.startswith((f"deploy/{SELF_SIGNED}/certs", "deploy/agent"))}
    assert named, "docs/deploy.md names no deploy/ or examples/ path"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/deploy.md names paths that do not exist: {missing}"


def test_pin_needed_images_component_adds_the_flag_and_reads_the_needed_list_only(render):
    target = "agent+agent/components/pin-needed-images"
    if target not in TARGETS:
        pytest.fail("deploy/agent/components/pin-needed-images is missing")
    documents = _docs(render, target)
    daemonset = _one(documents, "DaemonSet", "image-preflight-agent")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    args = build_parser()[0].parse_args([*container["command"][1:], *container["args"]])
    assert args.pin_needed_images == NEEDED_CONFIGMAP and args.publish
    role = _one(documents, "Role", "image-preflight-agent-needed-images")
    assert role["metadata"]["namespace"] == NEEDED_NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [NEEDED_NAME],
                              "verbs": ["get", "list", "watch"]}]
    binding = _one(documents, "RoleBinding", "image-preflight-agent-needed-images")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": daemonset["spec"]["template"]["spec"][
        "serviceAccountName"], "namespace": daemonset["metadata"]["namespace"]}]
    # The list is the trainer's: an apply of the agent must not overwrite it.
    assert not [d for d in documents if d["kind"] == "ConfigMap"]
    without = _docs(render, "agent")
    assert [d for d in documents if d["kind"] not in ("Role", "RoleBinding", "DaemonSet")] == [
        d for d in without if d["kind"] != "DaemonSet"]
