"""deploy/: every kustomization renders, validates against the Kubernetes schema, passes checkov,
and does what docs/deploy.md promises (fail-open, opt-in namespaces, read-only RBAC, hardening).

`kubectl` renders; checkov runs from its own virtualenv (`.venv-tools`, or $CHECKOV, or PATH).
Either one absent skips its tests with the reason, or fails them when $CI is set.
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

from image_preflight.cli import build_parser, main
from image_preflight.core.decision import DENY, decide
from image_preflight.files.inventory import load_inventory_file
from image_preflight.core.workloads import pod_spec_of

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
EXAMPLES = ROOT / "examples" / "swe-smith"
SERVICE = NAMESPACE = "image-preflight"
WEBHOOK = "validate.image-preflight.io"
SELF_SIGNED = "overlays/self-signed"
K8S_VERSION = latest_version()
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
# Custom resources have no schema in kubernetes-validate; every such group needs a line here.
CERT_MANAGER = "cert-manager.io"  # checked by cert_manager_problems() below
UNVALIDATED_GROUPS = {"image-preflight.io": "the node agent's own resources; their CRD is validated"}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "CustomResourceDefinition", "PriorityClass", "RuntimeClass", "StorageClass", "ClusterIssuer",
    "NodeImages",
}


def _kustomizations() -> dict[str, str]:
    """deploy/-relative directory -> kind (Kustomization or Component)."""
    found = {}
    for path in sorted(DEPLOY.rglob("*")):
        if path.name in KUSTOMIZATION_FILES and path.is_file():
            document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            found[path.parent.relative_to(DEPLOY).as_posix()] = document.get("kind", "Kustomization")
    return found


KUSTOMIZATIONS = _kustomizations()
COMPONENTS = sorted(d for d, kind in KUSTOMIZATIONS.items() if kind == "Component")
# Components are not standalone: each is rendered on top of the base.
TARGETS = sorted(d for d, kind in KUSTOMIZATIONS.items() if kind != "Component") + [f"base+{c}" for c in COMPONENTS]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI requires it")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        _unavailable("kubectl not on PATH: cannot run `kubectl kustomize`")
    return path


@pytest.fixture(scope="session")
def checkov() -> str:
    candidates = [os.environ.get("CHECKOV"), str(ROOT / ".venv-tools" / "bin" / "checkov"), shutil.which("checkov")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    _unavailable("checkov not found ($CHECKOV, .venv-tools/bin/checkov, PATH); see .ci/run")


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory) -> Path:
    """deploy/ in a temp dir with fresh certificates for the self-signed overlay and one overlay
    per component, so that nothing is written into the tree and no key is ever committed."""
    copy = tmp_path_factory.mktemp("deploy") / "deploy"
    own_certs = DEPLOY / SELF_SIGNED / "certs"
    shutil.copytree(DEPLOY, copy, ignore=lambda folder, names: ["certs"] if Path(folder) == own_certs.parent else [])
    if (copy / SELF_SIGNED).is_dir():
        out_dir = copy / SELF_SIGNED / "certs"
        assert main(["certs", "--service", SERVICE, "--namespace", NAMESPACE, "--out-dir", str(out_dir)]) == 0
    for component in COMPONENTS:
        overlay = copy / "_on-base" / component.replace("/", "-")
        overlay.mkdir(parents=True)
        kustomization = {"resources": ["../../base"], "components": [f"../../{component}"]}
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    return copy


def _target_dir(copy: Path, target: str) -> Path:
    if target.startswith("base+"):
        return copy / "_on-base" / target.removeprefix("base+").replace("/", "-")
    return copy / target


@pytest.fixture(scope="session")
def render(kubectl, deploy_copy):
    cache: dict[str, tuple[str, list[dict]]] = {}

    def rendered(target: str) -> tuple[str, list[dict]]:
        if target not in cache:
            result = subprocess.run(
                [kubectl, "kustomize", str(_target_dir(deploy_copy, target))],
                capture_output=True, text=True, check=False,
            )
            if result.returncode != 0:
                pytest.fail(f"kubectl kustomize deploy/{target} failed: {result.stderr.strip()}")
            cache[target] = (result.stdout, [d for d in yaml.safe_load_all(result.stdout) if d])
        return cache[target]

    return rendered


def _docs(render, target: str) -> list[dict]:
    return render(target)[1]


def _one(documents: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _group(document: dict) -> str:
    api_version = document["apiVersion"]
    return api_version.split("/")[0] if "/" in api_version else ""


def _webhook(documents: list[dict]) -> dict:
    configuration = _one(documents, "ValidatingWebhookConfiguration", "image-preflight")
    (hook,) = [h for h in configuration["webhooks"] if h["name"] == WEBHOOK]
    return hook


def _pod_spec(documents: list[dict]) -> dict:
    return _one(documents, "Deployment", "image-preflight")["spec"]["template"]["spec"]


def selector_matches(selector: dict, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector, as the apiserver evaluates namespace and object selectors."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


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
        group = _group(document)
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
def test_the_apiserver_accepts_every_object_in_a_server_side_dry_run(render, target, control_plane, tmp_path):
    """kube-apiserver 1.37 (tests/controlplane) validates, defaults and admits each object."""
    documents = render(target)[1]
    # The namespaces are made for real: a dry-run Namespace does not hold dry-run objects.
    for namespace in [d for d in documents if d["kind"] == "Namespace"]:
        control_plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(namespace))
    # cert-manager's CRDs cannot be installed here (no registry, no network); its objects are
    # checked by cert_manager_problems() instead.
    checked = [d for d in documents if _group(d) != CERT_MANAGER]
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(yaml.safe_dump_all(checked), encoding="utf-8")
    result = control_plane.kubectl("apply", "--server-side", "--dry-run=server", "-f", str(manifest), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("serverside-applied (server dry run)") == len(checked), result.stdout


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
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile, re.M)
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


def test_agentlightning_only_component_checks_only_agentlightning_objects(render):
    target = "base+components/agentlightning-only"
    if target not in TARGETS:
        pytest.fail("deploy/components/agentlightning-only is missing")
    differences = _differences_from_base(render, target)
    assert set(differences) == {"objectSelector"}
    job = yaml.safe_load((EXAMPLES / "missing-image-job.yaml").read_text(encoding="utf-8"))
    assert selector_matches(differences["objectSelector"], job["metadata"]["labels"])
    assert selector_matches(differences["objectSelector"], job["spec"]["template"]["metadata"]["labels"])
    assert not selector_matches(differences["objectSelector"], {"app.kubernetes.io/managed-by": "helm"})


def test_failure_policy_fail_component_changes_only_the_policy(render):
    target = "base+components/failure-policy-fail"
    if target not in TARGETS:
        pytest.fail("deploy/components/failure-policy-fail is missing")
    assert _differences_from_base(render, target) == {"failurePolicy": "Fail"}


# --- the walkthrough's example and document ---------------------------------------------------


def test_missing_image_job_is_an_agentlightning_job_the_example_node_would_deny():
    job = yaml.safe_load((EXAMPLES / "missing-image-job.yaml").read_text(encoding="utf-8"))
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "agentlightning"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    decision = decide(pod_spec_of(job), load_inventory_file(EXAMPLES / "nodes.json"))
    assert decision.outcome == DENY
    assert [v.missing_on for v in decision.verdicts] == [("cpu-node-1",)]


def test_deploy_doc_names_only_paths_that_exist():
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "## The node agent" in text
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples)/[\w./-]*\w", text)}
    # certs/ is what `image-preflight certs` creates; deploy/agent is the node agent's, maintained apart.
    named = {p for p in named if not p.startswith((f"deploy/{SELF_SIGNED}/certs", "deploy/agent"))}
    assert named, "docs/deploy.md names no deploy/ or examples/ path"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/deploy.md names paths that do not exist: {missing}"
