"""The Helm chart (deploy/chart/image-preflight): `helm lint --strict` passes each of its ci/
cases, each renders objects that validate against the Kubernetes schema and pass checkov, its
schema refuses wrong values naming them, and it does what its README and docs/deploy.md promise
(fail-open, opt-in namespaces, read-only RBAC, hardening, certificates three ways).

`helm` and `helm4` come from tests/controlplane/build (tests/chart.py); checkov runs from its own
virtualenv (`.venv-tools`, or $CHECKOV, or PATH). Either one absent skips its tests with the
reason, or fails them when $CI is set. The server-side dry run on the real apiserver is
tests/cluster/test_cluster_chart.py.
"""

from __future__ import annotations

import base64
import functools
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

from image_preflight.cli import build_parser, parse_config
from image_preflight.core.decide.decision import DENY, decide
from image_preflight.core.decide.workloads import pod_spec_of
from image_preflight.core.image_gc.pinning import NEEDED_CONFIGMAP, NEEDED_NAME, NEEDED_NAMESPACE
from image_preflight.doctor.findings import selects as selector_matches  # metav1.LabelSelector
from image_preflight.files.inventory import load_inventory_file
from tests.agent_lightning import build_job_spec, example_row
from tests.builders.chart_objects import CERT_MANAGER, MONITORING, api_group
from tests.builders.reviews import EXAMPLES
from tests.chart import AGENT_NAMESPACE, CASES, CHART, NAMESPACE, SERVICE, case_file, helm_binary, render, template
from tests.needs import unavailable

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK = "validate.image-preflight.io"
K8S_VERSION = latest_version()
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


@functools.cache
def _rendered(case: str) -> tuple[str, list[dict]]:
    """`helm template` of a ci/ case, the CRD included: its text and its objects."""
    text = template(case=case).stdout
    return text, [d for d in yaml.safe_load_all(text) if d]


def _docs(case: str) -> list[dict]:
    return _rendered(case)[1]


@functools.cache
def _with(values_json: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(template(json.loads(values_json)).stdout) if d]


def _docs_with(values: dict) -> list[dict]:
    """The chart's defaults with `values` layered on, rendered once a session."""
    return _with(json.dumps(values, sort_keys=True))


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


# --- every case ------------------------------------------------------------------------------


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


@pytest.mark.parametrize(("values", "refused"), [
    ({"webhook": {"mode": "enforcing"}}, "webhook.mode"),
    ({"webhook": {"failurePolicy": "fail"}}, "webhook.failurePolicy"),
    ({"webhook": {"timeoutSeconds": 31}}, "webhook.timeoutSeconds"),
    ({"webhook": {"maxImages": -5}}, "webhook.maxImages"),
    ({"webhook": {"replicas": "two"}}, "webhook.replicas"),
    ({"webhook": {"steering": {"enable": True}}}, "webhook.steering"),
    ({"webhook": {"antiAffinity": "strict"}}, "webhook.antiAffinity"),
    ({"webhok": {"replicas": 2}}, "webhok"),
    ({"certificates": {"mode": "self-signed"}}, "certificates.mode"),
    ({"certificates": {"certManager": {"duration": "90d"}}}, "certificates.certManager.duration"),
    ({"agent": {"criSocket": "run/containerd.sock"}}, "agent.criSocket"),
    ({"agent": {"leaseSeconds": 0}}, "agent.leaseSeconds"),
    ({"agent": {"intervalSeconds": 0}}, "agent.intervalSeconds"),
    ({"watchdog": {"mode": "warn"}}, "watchdog.mode"),
    ({"watchdog": {"graceSeconds": -1}}, "watchdog.graceSeconds"),
    ({"securityContext": "restricted"}, "securityContext"),
    ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    ({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Equals"}]}},
     "namespaceSelector.matchExpressions"),
    ({"excludedNamespaces": ["Kube-System"]}, "excludedNamespaces"),
    ({"tests": {"namespace": "a_b"}}, "tests.namespace"),
])
@pytest.mark.parametrize("helm", ["helm", "helm4"])
def test_the_schema_refuses_a_wrong_value_naming_it(values, refused, helm):
    done = template(values, helm=helm, check=False)
    assert done.returncode != 0 and not done.stdout
    # Helm names the value by its JSON pointer (/webhook/mode) or its path (webhook.mode).
    named = (f"/{refused.replace('.', '/')}", refused)
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert any(name in done.stderr for name in named), done.stderr


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


# --- the defaults ----------------------------------------------------------------------------


def test_webhook_fails_open_quickly_without_side_effects():
    hook = _webhook(_docs("default"))
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 5
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert "objectSelector" not in hook and "matchConditions" not in hook


def test_webhook_sees_jobs_and_pods_on_create_and_update():
    rules = {
        (tuple(r["apiGroups"]), tuple(r["apiVersions"]), tuple(r["resources"])): set(r["operations"])
        for r in _webhook(_docs("default"))["rules"]
    }
    assert rules == {(("batch",), ("v1",), ("jobs",)): {"CREATE", "UPDATE"},
                     (("",), ("v1",), ("pods",)): {"CREATE", "UPDATE"}}


def test_webhook_reaches_the_server_through_the_service():
    documents = _docs("default")
    service_ref = _webhook(documents)["clientConfig"]["service"]
    assert service_ref == {"name": SERVICE, "namespace": NAMESPACE, "path": "/validate", "port": 443}
    service = _one(documents, "Service", SERVICE)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == 443]
    container = _pod_spec(documents)["containers"][0]
    by_name = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert by_name[port["targetPort"]] == 8443
    assert selector_matches({"matchLabels": service["spec"]["selector"]},
                            _one(documents, "Deployment", SERVICE)["spec"]["template"]["metadata"]["labels"])


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
def test_enforcement_is_opt_in_and_spares_system_namespaces(labels, enforced):
    assert selector_matches(_webhook(_docs("default"))["namespaceSelector"], labels) is enforced


def test_the_release_namespace_is_spared_wherever_the_chart_is_installed():
    documents = [d for d in yaml.safe_load_all(template(namespace="preflight").stdout) if d]
    selector = _webhook(documents)["namespaceSelector"]
    assert not selector_matches(selector, {"kubernetes.io/metadata.name": "preflight",
                                           "image-preflight.io/enforce": "true"})
    assert selector_matches(selector, {"kubernetes.io/metadata.name": NAMESPACE, "image-preflight.io/enforce": "true"})


def test_cluster_role_only_reads_nodes_node_images_and_runtime_classes():
    documents = _docs("default")
    rules = _one(documents, "ClusterRole", "image-preflight")["rules"]
    granted = {(group, resource): set(rule["verbs"])
               for rule in rules for group in rule["apiGroups"] for resource in rule["resources"]}
    assert granted == {("", "nodes"): {"list", "watch"}, ("image-preflight.io", "nodeimages"): {"list", "watch"},
                       ("node.k8s.io", "runtimeclasses"): {"list", "watch"}}
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in rules)
    binding = _one(documents, "ClusterRoleBinding", "image-preflight")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "image-preflight"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "image-preflight", "namespace": NAMESPACE}]
    assert _pod_spec(documents)["serviceAccountName"] == "image-preflight"


@pytest.mark.parametrize("name", ["image-preflight", "image-preflight-watchdog"])
def test_deployments_are_hardened(name):
    spec = _one(_docs("default"), "Deployment", name)["spec"]["template"]["spec"]
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


def test_deployment_runs_two_spread_replicas_of_this_version():
    documents = _docs("default")
    deployment = _one(documents, "Deployment", SERVICE)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    spec = deployment["spec"]["template"]["spec"]
    (spread,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = spread["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname" and term["matchLabelKeys"] == ["pod-template-hash"]
    assert selector_matches(term["labelSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == chart["version"] == project
    container = spec["containers"][0]
    assert container["image"] == f"image-preflight:{project}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    probes = {name: container[name]["httpGet"] for name in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
    assert {p["scheme"] for p in probes.values()} == {"HTTPS"}
    budget = _one(documents, "PodDisruptionBudget", SERVICE)
    assert budget["spec"]["minAvailable"] == 1
    assert selector_matches(budget["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])


def test_hard_anti_affinity_requires_other_nodes_and_none_spreads_nothing():
    documents = _docs_with({"webhook": {"antiAffinity": "hard"}, "watchdog": {"antiAffinity": "none"}})
    (term,) = _pod_spec(documents)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert "affinity" not in _one(documents, "Deployment", "image-preflight-watchdog")["spec"]["template"]["spec"]
    given = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    assert _pod_spec(_docs_with({"webhook": {"affinity": given}}))["affinity"] == given


def test_the_client_ca_comes_from_the_named_secret_and_only_ca_crt():
    spec = _pod_spec(_docs_with({"webhook": {"tls": {"clientCASecret": "apiserver-client-ca"}}}))
    (volume,) = [v for v in spec["volumes"] if v["name"] == "client-ca"]
    assert volume["secret"] == {"secretName": "apiserver-client-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "client-ca"]
    assert mount == {"name": "client-ca", "mountPath": "/etc/image-preflight/client-ca", "readOnly": True}
    assert not [v for v in _pod_spec(_docs("default"))["volumes"] if v["name"] == "client-ca"]


def test_the_apiservers_service_carries_https_only_and_metrics_have_their_own():
    documents = _docs("everything")
    assert [p["name"] for p in _one(documents, "Service", SERVICE)["spec"]["ports"]] == ["https"]
    metrics = _one(documents, "Service", f"{SERVICE}-metrics")
    assert [(p["name"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [("metrics", "metrics")]
    (monitor,) = [d for d in documents if d["kind"] == "ServiceMonitor"]
    assert selector_matches(monitor["spec"]["selector"], metrics["metadata"]["labels"])
    assert not selector_matches(monitor["spec"]["selector"], _one(documents, "Service", SERVICE)["metadata"]["labels"])


def test_the_network_policy_admits_the_sources_given_for_each_port():
    apiserver = [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    scraper = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    policy = _one(_docs_with({"webhook": {"networkPolicy": {"from": apiserver, "metricsFrom": scraper}}}),
                  "NetworkPolicy", SERVICE)
    assert [(rule["ports"][0]["port"], rule["from"]) for rule in policy["spec"]["ingress"]] == [
        ("https", apiserver), ("metrics", scraper)]
    default = _one(_docs("default"), "NetworkPolicy", SERVICE)
    assert [(rule["ports"][0]["port"], "from" in rule) for rule in default["spec"]["ingress"]] == [
        ("https", False), ("metrics", False)]


def test_deployment_arguments_are_valid_serve_flags_reading_the_mounted_secret():
    spec = _pod_spec(_docs("default"))
    container = spec["containers"][0]
    args = parse_config(["serve", *container["args"]])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    assert args.tls_cert == Path(mount["mountPath"]) / "tls.crt"
    assert args.tls_key == Path(mount["mountPath"]) / "tls.key"
    assert (args.port, args.mode, args.unknown, args.max_images, args.steer) == (8443, "enforce", "allow", 50, False)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == f"{SERVICE}-tls"  # `image-preflight certs --secret`'s name
    # The CA's key is in the Secret only in mode secret (the user's own); the Pod never mounts it.
    assert {item["key"] for item in volume["secret"]["items"]} == {"tls.crt", "tls.key"}


@pytest.mark.parametrize(("values", "flags"), [
    ({"webhook": {"mode": "warn", "unknown": "deny", "require": "any", "maxImages": -1, "logLevel": "debug"}},
     {"mode": "warn", "unknown": "deny", "require": "any", "max_images": -1, "log_level": "debug"}),
    ({"webhook": {"steering": {"enabled": True, "maxNodes": 7}, "extraArgs": ["--max-inventory-age=60"]}},
     {"steer": True, "steer_max_nodes": 7, "max_inventory_age": 60.0}),
    ({}, {"tls_min_version": "1.3", "client_ca": None}),
    ({"webhook": {"tls": {"minVersion": "1.2", "clientCASecret": "apiserver-client-ca"}}},
     {"tls_min_version": "1.2", "client_ca": Path("/etc/image-preflight/client-ca/ca.crt")}),
])
def test_the_webhooks_values_become_its_flags(values, flags):
    args = parse_config(["serve", *_pod_spec(_docs_with(values))["containers"][0]["args"]])
    assert {name: getattr(args, name) for name in flags} == flags


def test_dockerfile_matches_the_deployment():
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    context = _pod_spec(_docs("default"))["containers"][0]["securityContext"]
    # The base users pull by default, by digest (tests/deploy/test_image_build.py); a build without
    # a registry names a local one.
    assert re.search(r"^ARG BASE=python:3\.11\.\d+-slim-bookworm@sha256:", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE\}$", dockerfile, re.M)
    assert re.search(rf"^USER {context['runAsUser']}:{context['runAsGroup']}$", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["image-preflight", "serve"\]$', dockerfile, re.M)
    admitted = {line[1:].strip("/") for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
                if line.startswith("!")}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {setuptools.get("package-dir", {}).get(p, p.replace(".", "/")).split("/")[0]
               for p in setuptools["packages"]}
    assert folders | {"pyproject.toml", "README.md", "deploy/image/requirements.txt"} <= admitted


# --- certificates ----------------------------------------------------------------------------


def test_generated_certificates_chain_to_the_ca_bundle_and_name_the_service():
    documents = _docs("default")
    secret = _one(documents, "Secret", f"{SERVICE}-tls")
    assert secret["type"] == "kubernetes.io/tls" and secret["metadata"]["namespace"] == NAMESPACE
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    serving = x509.load_pem_x509_certificate(data["tls.crt"])
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert names == [f"{SERVICE}.{NAMESPACE}.svc", f"{SERVICE}.{NAMESPACE}.svc.cluster.local"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    for hook in _one(documents, "ValidatingWebhookConfiguration")["webhooks"]:
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == data["ca.crt"]
    authority = _one(documents, "Secret", "image-preflight-ca")
    assert base64.b64decode(authority["data"]["tls.crt"]) == data["ca.crt"]
    assert (serving.not_valid_after_utc - serving.not_valid_before_utc).days == 365
    assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days == 3650
    not_after = int(secret["metadata"]["annotations"]["image-preflight.io/not-after"])
    assert abs(not_after - serving.not_valid_after_utc.timestamp()) < 60
    from cryptography.hazmat.primitives.asymmetric import ec
    assert isinstance(serving.public_key(), ec.EllipticCurvePublicKey)


def test_steering_trusts_the_same_generated_ca():
    documents = _docs_with({"webhook": {"steering": {"enabled": True}}})
    (mutating,) = _one(documents, "MutatingWebhookConfiguration")["webhooks"]
    assert mutating["clientConfig"]["caBundle"] == _webhook(documents)["clientConfig"]["caBundle"]


def test_an_existing_secret_is_mounted_and_its_ca_given_is_the_bundle():
    documents = _docs("secret")
    assert not [d for d in documents if d["kind"] == "Secret"]  # the user's own
    given = yaml.safe_load(case_file("secret").read_text())["certificates"]["secret"]
    assert _webhook(documents)["clientConfig"]["caBundle"] == given["caBundle"]
    (volume,) = [v for v in _pod_spec(documents)["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == given["name"]


def test_an_existing_secret_without_a_ca_bundle_is_refused_where_it_cannot_be_read():
    done = template({"certificates": {"mode": "secret"}}, check=False)
    assert done.returncode != 0
    assert ("certificates.secret.caBundle: not set, and no ca.crt in Secret image-preflight/image-preflight-tls"
            in done.stderr)


def test_cert_manager_issues_the_mounted_secret_and_injects_its_ca():
    documents = _docs("cert-manager")
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
    (ca_certificate,) = [c for c in certificates.values()
                         if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]]
    assert ca_certificate["spec"]["isCA"] is True
    assert "selfSigned" in issuers[ca_certificate["spec"]["issuerRef"]["name"]]["spec"]
    assert all(d["metadata"]["namespace"] == NAMESPACE for d in [*issuers.values(), *certificates.values()])


def test_cert_manager_with_an_issuer_of_yours_makes_no_ca_and_injects_into_both_configurations():
    documents = _docs("cert-manager-issuer")
    assert not [d for d in documents if d["kind"] == "Issuer"]
    (certificate,) = [d for d in documents if d["kind"] == "Certificate"]
    assert certificate["spec"]["issuerRef"] == {"name": "cluster-ca", "kind": "ClusterIssuer",
                                                "group": "cert-manager.io"}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert _one(documents, kind)["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/image-preflight-serving"}


# --- values that add or change objects ---------------------------------------------------------


def _differences_from_defaults(documents: list[dict]) -> dict:
    base, changed = _webhook(_docs("default")), _webhook(documents)
    return {k: changed.get(k) for k in set(base) | set(changed)
            if k != "clientConfig" and base.get(k) != changed.get(k)}


def test_agentlightning_only_matches_agentlightnings_jobs_and_their_pods():
    """build_job_spec labels the Job, not its Pods (the real template labels them app: agl-rollout
    only), so the condition matches Jobs by label and Pods by the job-name label the apiserver adds
    to every Job's template. Its behaviour is proved on a real control plane in
    tests/cluster/test_cluster_agentlightning.py; here, its shape."""
    documents = _docs_with({"agentlightningOnly": True})
    differences = _differences_from_defaults(documents)
    assert set(differences) == {"matchConditions"}  # the rules and namespaceSelector stay the defaults'
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


def test_failure_policy_fail_changes_only_the_policy():
    assert _differences_from_defaults(_docs_with({"webhook": {"failurePolicy": "Fail"}})) == {"failurePolicy": "Fail"}


def test_steering_sends_pod_creates_to_mutate_like_the_validating_webhook():
    for only in (False, True):
        documents = _docs_with({"webhook": {"steering": {"enabled": True}}, "agentlightningOnly": only})
        (hook,) = _one(documents, "MutatingWebhookConfiguration", "image-preflight")["webhooks"]
        validating = _webhook(documents)
        assert hook["clientConfig"] == {**validating["clientConfig"],
                                        "service": {**validating["clientConfig"]["service"], "path": "/mutate"}}
        assert hook["namespaceSelector"] == validating["namespaceSelector"]
        # The same match conditions: agentlightningOnly steers only what it checks.
        assert hook.get("matchConditions") == validating.get("matchConditions")
        assert (hook["failurePolicy"], hook["sideEffects"], hook["reinvocationPolicy"]) == (
            "Ignore", "None", "IfNeeded")
        assert hook["timeoutSeconds"] <= 3
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                  "operations": ["CREATE"], "scope": "Namespaced"}]
        args = parse_config(["serve", *_pod_spec(documents)["containers"][0]["args"]])
        assert args.steer
        roles = [d for d in documents if d["kind"] in ("ClusterRole", "Role")]
        assert roles == [d for d in _docs("default") if d["kind"] in ("ClusterRole", "Role")]  # RBAC unchanged
    assert not [d for d in _docs("default") if d["kind"] == "MutatingWebhookConfiguration"]


@pytest.mark.parametrize("case", ["default", "everything"])
def test_the_watchdog_watches_the_namespaces_the_webhook_checks(case):
    """Its --namespace-selector is the webhook's namespaceSelector written as a label selector
    (k8s.io/apimachinery/pkg/labels): the same namespaces, the excluded ones left out too."""
    documents = _docs(case)
    deployment = _one(documents, "Deployment", "image-preflight-watchdog")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert type(args).__name__ == "WatchdogConfig"
    selector = _webhook(documents)["namespaceSelector"]
    samples = [{"kubernetes.io/metadata.name": name, **labels}
               for name in ("rollouts", "kube-system", "monitoring", NAMESPACE, "default")
               for labels in ({}, {"image-preflight.io/enforce": "true"}, {"image-preflight.io/enforce": "false"},
                              {"team": "rl", "image-preflight.io/enforce": "true"}, {"team": "rl"})]
    assert [label_selector_matches(args.namespace_selector, s) for s in samples] == [
        selector_matches(selector, s) for s in samples]
    binding = _one(documents, "ClusterRoleBinding", "image-preflight-watchdog")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"],
                                    "namespace": deployment["metadata"]["namespace"]}]
    assert container["securityContext"] == _pod_spec(documents)["containers"][0]["securityContext"]


def label_selector_matches(selector: str, labels: dict) -> bool:
    """k8s.io/apimachinery/pkg/labels Parse, for what the chart writes: `k=v`, `k in (..)`,
    `k notin (..)`, `k`, `!k`, joined by commas outside parentheses."""
    terms = re.findall(r"[^,(]+(?:\([^)]*\))?", selector)
    for term in (t.strip() for t in terms if t.strip()):
        if match := re.fullmatch(r"(\S+) (in|notin) \((.*)\)", term):
            key, operator, values = match[1], match[2], match[3].split(",")
            if (operator == "in") != (labels.get(key) in values if key in labels else False):
                if operator == "in" or key in labels:
                    return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "=" in term:
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


def test_the_watchdog_s_values_become_its_flags():
    documents = _docs("everything")
    (container,) = _one(documents, "Deployment", "image-preflight-watchdog")["spec"]["template"]["spec"]["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert (args.grace, args.mode, args.include_always) == (30.0, "audit", True)
    assert not [d for d in _docs("minimal") if "watchdog" in d["metadata"]["name"]]


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
    from image_preflight.core.admission.body import parse_review
    from image_preflight.core.admission.review import admit
    from image_preflight.core.admission.settings import Settings

    review = parse_review((EXAMPLES / "admission-review.json").read_bytes())
    answer = admit(review, load_inventory_file(EXAMPLES / "nodes.json"), Settings()).review["response"]
    message = answer["status"]["message"]
    denial = f'admission webhook "{WEBHOOK}" denied the request: {message}'
    assert denial in _text_blocks((ROOT / "docs" / "agent-lightning.md").read_text(encoding="utf-8"))
    # The walkthrough's kind cluster has one node, preflight-control-plane.
    # kubectl words a Status of reason Invalid without details "The request is invalid: <message>"
    # (k8s.io/kubectl pkg/cmd/util/helpers.go, checkErr), as the quickstart's run on the real node shows.
    kind = 'The request is invalid: error when creating "examples/swe-smith/missing-image-job.yaml": ' + denial.replace(
        "cpu-node-1", "preflight-control-plane")
    assert kind in _text_blocks((ROOT / "docs" / "deploy.md").read_text(encoding="utf-8"))


def test_agent_lightning_doc_names_only_paths_that_exist():
    text = (ROOT / "docs" / "agent-lightning.md").read_text(encoding="utf-8")
    # examples/swe_smith/ and docs/NN-*.md are agent-lightning's own files; its links are to ours.
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples/swe-smith)/[\w./-]*\w", text)}
    named |= {f"docs/{m}" for m in re.findall(r"\]\(([\w-]+\.md)", text)}
    assert "docs/quickstart.md" in named and "docs/agent.md" in named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/agent-lightning.md names paths that do not exist: {missing}"


def test_deploy_doc_names_only_paths_that_exist():
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "## The node agent" in text
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples)/[\w./-]*\w", text)}
    assert "deploy/chart/image-preflight" in named, "docs/deploy.md names no chart"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/deploy.md names paths that do not exist: {missing}"


def test_the_quickstart_names_only_paths_that_exist_and_skips_only_lines_it_shows():
    """tests/cluster/test_real_node_chart.py runs the page; here, what it can check without a cluster:
    every line the run leaves out (tests/node/quickstart.py SUBSTITUTED) is on the page, and
    every path it names exists."""
    from tests.node import quickstart

    lines = {line.split("#")[0].strip() for block in quickstart.blocks() for line in block.text.splitlines()}
    assert set(quickstart.SUBSTITUTED) <= lines
    exported = {re.match(r"export (\w+)=", line)[1] for line in lines if line.startswith("export ")}
    assert set(quickstart.PLACEHOLDERS) <= exported
    text = quickstart.PAGE.read_text(encoding="utf-8")
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples/swe-smith|docs)/[\w./-]*\w", text)}
    named |= {f"docs/{m}" for m in re.findall(r"\]\(([\w-]+\.md)", text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/quickstart.md names paths that do not exist: {missing}"
    # Its publishing and install are the chart's README's (tests/deploy/test_oci_chart.py runs
    # those), and its release the one the chart's NOTES and doctor name.
    from tests.oci_registry import readme_block

    for line in readme_block().replace("\\\n", " ").splitlines():
        assert " ".join(line.split()[:4]) in " ".join(text.split()), line
    readme_top = (ROOT / "README.md").read_text(encoding="utf-8")[:600]
    assert "(docs/quickstart.md)" in readme_top


def test_pinning_adds_the_flag_and_reads_the_needed_list_only(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    documents = _docs("default")
    daemonset = _one(documents, "DaemonSet", "image-preflight-agent")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert args.pin_needed_images == NEEDED_CONFIGMAP and args.publish
    role = _one(documents, "Role", "image-preflight-agent-needed-images")
    assert role["metadata"]["namespace"] == NEEDED_NAMESPACE == AGENT_NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [NEEDED_NAME],
                              "verbs": ["get", "list", "watch"]}]
    binding = _one(documents, "RoleBinding", "image-preflight-agent-needed-images")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": daemonset["spec"]["template"]["spec"][
        "serviceAccountName"], "namespace": daemonset["metadata"]["namespace"]}]
    # The list is the trainer's: no install or upgrade may overwrite it.
    for case in CASES:
        assert not [d for d in _docs(case) if d["kind"] == "ConfigMap"], case
    without = _docs_with({"agent": {"pinning": {"enabled": False}}})
    (container,) = _one(without, "DaemonSet", "image-preflight-agent")["spec"]["template"]["spec"]["containers"]
    assert not parse_config([*container["command"][1:], *container["args"]]).pin_needed_images
    assert not [d for d in without if d["metadata"]["name"] == "image-preflight-agent-needed-images"]


def test_the_agents_values_become_its_flags_and_mount(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    documents = _docs("everything")
    pod = _one(documents, "DaemonSet", "image-preflight-agent")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert (args.interval, args.lease, args.sandbox_image) == (20.0, 120, "registry.k8s.io/pause:3.10.1")
    (volume,) = pod["volumes"]
    assert volume["hostPath"] == {"path": "/run/k3s/containerd/containerd.sock", "type": "Socket"}
    assert args.cri_endpoint == "unix://" + container["volumeMounts"][0]["mountPath"]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/rollouts": "true"}
    assert pod["priorityClassName"] == "system-node-critical"


def test_the_crd_is_a_template_upgraded_with_the_release_and_kept_on_uninstall():
    """As cert-manager's chart: crds.enabled renders it among the templates (so `helm upgrade`
    applies its newer rules; crds/ is installed once), crds.keep marks it for Helm to leave."""
    plain = yaml.safe_load((CHART / "files" / "nodeimages-crd.yaml").read_text(encoding="utf-8"))
    assert not (CHART / "crds").exists()
    crd = _one(render(hooks=False), "CustomResourceDefinition", plain["metadata"]["name"])
    assert crd["spec"] == plain["spec"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    unkept = _one(_docs_with({"crds": {"keep": False}}), "CustomResourceDefinition", plain["metadata"]["name"])
    assert "annotations" not in unkept["metadata"]
    assert not [d for d in _docs_with({"crds": {"enabled": False}}) if d["kind"] == "CustomResourceDefinition"]


def test_the_agent_is_probed_on_its_metrics_port_the_one_its_network_policy_opens(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    for values in ({}, {"agent": {"metricsPort": 9100}}):
        documents = _docs_with(values)
        (container,) = _one(documents, "DaemonSet", "image-preflight-agent")["spec"]["template"]["spec"]["containers"]
        port = parse_config([*container["command"][1:], *container["args"]]).metrics_port
        assert port == values.get("agent", {}).get("metricsPort", 9090)
        assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        policy = _one(documents, "NetworkPolicy", "image-preflight-agent")
        assert policy["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]


def test_the_node_restriction_policy_binds_the_agents_writes_to_their_nodes():
    """kubernetes pkg/registry/core/serviceaccount/storage/token.go (TokenREST.Create) puts the
    Pod's node in a pod-bound token, and k8s.io/apiserver pkg/authentication/serviceaccount/util.go
    (NodeNameKey) in the requester's extra: the policy compares it with the object's name. Its
    effect on the real apiserver: tests/cluster/test_real_node_chart.py."""
    documents = _docs("default")
    policy = _one(documents, "ValidatingAdmissionPolicy", "image-preflight-agent-own-node")
    lists, leases = policy["spec"]["matchConstraints"]["resourceRules"]
    assert lists == {"apiGroups": ["image-preflight.io"], "apiVersions": ["*"], "resources": ["nodeimages"],
                     "operations": ["CREATE", "UPDATE", "DELETE"]}
    # The Lease that renews a hashed list, held to the node by its name and spec.holderIdentity.
    assert leases == {"apiGroups": ["coordination.k8s.io"], "apiVersions": ["*"], "resources": ["leases"],
                      "operations": ["CREATE", "UPDATE", "DELETE"]}
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f"request.userInfo.username == \"system:serviceaccount:{AGENT_NAMESPACE}:image-preflight-agent\"")
    assert "authentication.kubernetes.io/node-name" in policy["spec"]["variables"][0]["expression"]
    # A Pod-bound token only, and spec.nodeName checked too (a DELETE's from oldObject): its effect
    # on the real apiserver, tests/cluster/test_cluster_agent_policy.py.
    variables = " ".join(v["expression"] for v in policy["spec"]["variables"])
    assert "authentication.kubernetes.io/pod-name" in variables and "oldObject" in variables
    assert "spec.nodeName" in variables and "spec.holderIdentity" in variables
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = _one(documents, "ValidatingAdmissionPolicyBinding", "image-preflight-agent-own-node")
    assert binding["spec"] == {"policyName": "image-preflight-agent-own-node", "validationActions": ["Deny"]}
    off = _docs_with({"agent": {"nodeRestriction": {"enabled": False}}})
    assert not [d for d in off
                if d["kind"].startswith("ValidatingAdmissionPolicy") and "own-node" in d["metadata"]["name"]]


@pytest.mark.parametrize("helm", ["helm", "helm4"])
def test_the_watchdogs_write_policy_cannot_be_turned_off_while_the_watchdog_runs(helm):
    """Its ClusterRole patches Jobs and creates Pods cluster-wide: without the policy a stolen token
    reaches every namespace (Pods in kube-system)."""
    done = template({"watchdog": {"writeRestriction": {"enabled": False}}}, helm=helm, check=False)
    assert done.returncode != 0 and not done.stdout
    # One line says it (Helm 3 adds its hint about --debug below).
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("Error:")]
    assert line.endswith("watchdog.writeRestriction.enabled=false would leave the watchdog's cluster-wide Job patch "
                         "and Pod create unguarded: keep it true, or set watchdog.enabled=false"), done.stderr
    off = template({"watchdog": {"enabled": False, "writeRestriction": {"enabled": False}}}, helm=helm)
    assert not [d for d in yaml.safe_load_all(off.stdout) if d and "watchdog" in d["metadata"]["name"]]


def test_the_agent_and_the_watchdog_start_only_under_their_write_policies_which_they_may_read_by_name(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    for restricted in (True, False):
        documents = _docs_with({"agent": {"nodeRestriction": {"enabled": restricted}}})
        faces = {("DaemonSet", "image-preflight-agent"): "image-preflight-agent-own-node",
                 ("Deployment", "image-preflight-watchdog"): "image-preflight-watchdog-writes"}
        for (kind, name), policy in faces.items():
            (container,) = _one(documents, kind, name)["spec"]["template"]["spec"]["containers"]
            args = parse_config([*container["command"][1:], *container["args"]])
            guarded = restricted or name == "image-preflight-watchdog"
            assert args.write_policy == (policy if guarded else None), (name, restricted)
            assert {d["kind"] for d in documents if d["metadata"]["name"] == policy} == (
                {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} if guarded else set())
            reads = [r for r in _one(documents, "ClusterRole", name)["rules"]
                     if r["apiGroups"] == ["admissionregistration.k8s.io"]]
            assert reads == ([{"apiGroups": ["admissionregistration.k8s.io"],
                               "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
                               "resourceNames": [policy], "verbs": ["get"]}] if guarded else []), (name, restricted)


def test_helm_test_runs_doctor_against_an_opted_in_namespace_of_its_own():
    documents = _docs("default")
    (pod,) = [d for d in documents if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert type(args).__name__ == "DoctorConfig" and args.namespace == "image-preflight-test"
    # The Service's address from its environment: a test Pod needs no cluster DNS.
    assert args.webhook_address == "$(IMAGE_PREFLIGHT_SERVICE_HOST):$(IMAGE_PREFLIGHT_SERVICE_PORT_HTTPS)"
    assert pod["spec"]["enableServiceLinks"] is True
    namespace = _one(documents, "Namespace", "image-preflight-test")
    assert selector_matches(_webhook(documents)["namespaceSelector"],
                            {**namespace["metadata"]["labels"], "kubernetes.io/metadata.name": "image-preflight-test"})
    # Helm 3's `helm test --logs` reads every test hook as a Pod: the Pod is the only one.
    assert [d["kind"] for d in documents
            if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"] == ["Pod"]
    assert not [d for d in _docs("minimal") if "image-preflight-test" in d["metadata"]["name"]]


def test_the_uninstall_hook_deletes_node_images_with_a_role_of_its_own():
    documents = _docs("default")
    hooks = [d for d in documents if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "post-delete"]
    assert sorted(d["kind"] for d in hooks) == [
        "ClusterRole", "ClusterRoleBinding", "Job", "NetworkPolicy", "ServiceAccount"]
    (job,) = [d for d in hooks if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = build_parser()[0].parse_args([*container["command"][1:], *container["args"]])
    assert (args.command, args.action) == ("inventory", "delete")
    (role,) = [d for d in hooks if d["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": ["image-preflight.io"], "resources": ["nodeimages"], "verbs": ["list", "delete"]}]
    # Roles first, the Job last; each gone once it succeeded.
    weights = {d["kind"]: int(d["metadata"]["annotations"].get("helm.sh/hook-weight", "0")) for d in hooks}
    assert max(weights[k] for k in ("ClusterRole", "ClusterRoleBinding", "NetworkPolicy", "ServiceAccount")) \
        < weights["Job"]
    assert {d["metadata"]["annotations"]["helm.sh/hook-delete-policy"] for d in hooks} == {
        "before-hook-creation,hook-succeeded,hook-failed"}


def test_every_object_of_the_uninstall_hook_goes_whether_it_succeeds_or_fails():
    """Helm's hook-delete-policy values (pkg/action/hooks.go): before-hook-creation, hook-succeeded,
    hook-failed. A failed hook's Job goes by hook-failed, the objects run before it by
    hook-succeeded; tests/cluster/test_cluster_agent_policy.py fails one for real."""
    for case in ("default", "minimal"):
        hooks = [d for d in _docs(case)
                 if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "post-delete"]
        assert hooks
        for hook in hooks:
            policies = hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")
            assert sorted(policies) == ["before-hook-creation", "hook-failed", "hook-succeeded"], hook["kind"]


def test_the_helm_test_account_writes_only_dry_runs():
    """Its Role lets it create Jobs, for doctor's dry-run rollout Job: a policy refuses every write
    of it that is not a dry run. An ordinary object of the release, like the account, so it is in
    force before `helm test` and goes at uninstall; the test Pod stays the only test hook."""
    documents = _docs("default")
    policy = _one(documents, "ValidatingAdmissionPolicy", "image-preflight-test-dry-runs-only")
    assert "helm.sh/hook" not in (policy["metadata"].get("annotations") or {})
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["*"], ["*/*"])
    assert {"CREATE", "UPDATE", "DELETE"} <= set(rule["operations"])
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:image-preflight-test"')
    assert [v["expression"] for v in policy["spec"]["validations"]] == ["request.dryRun == true"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = _one(documents, "ValidatingAdmissionPolicyBinding", "image-preflight-test-dry-runs-only")
    assert binding["spec"] == {"policyName": "image-preflight-test-dry-runs-only", "validationActions": ["Deny"]}
    assert not [d for d in _docs_with({"tests": {"enabled": False}}) if "image-preflight-test" in d["metadata"]["name"]]


def test_the_readme_lists_every_value_and_no_other():
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))

    def leaves(tree: dict, prefix: str = "") -> set[str]:
        found = set()
        for key, value in tree.items():
            path = f"{prefix}{key}"
            # Kubernetes structures and free maps are one value each.
            if isinstance(value, dict) and value and key not in OPAQUE_VALUES:
                found |= leaves(value, f"{path}.")
            else:
                found.add(path)
        return found

    readme = (CHART / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.]+)` \|", readme, re.M))
    assert listed == leaves(values)


# Values that are one Kubernetes structure or a free map, not a tree of values.
OPAQUE_VALUES = {"resources", "podSecurityContext", "securityContext", "matchLabels", "labels", "nodeSelector",
                 "affinity", "issuerRef"}


def test_the_schema_describes_every_value_the_chart_has():
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))

    def unknown(tree: dict, node: dict, path: str) -> list[str]:
        out = []
        for key, value in tree.items():
            child = (node.get("properties") or {}).get(key)
            if child is None:
                out.append(f"{path}{key}")
            elif isinstance(value, dict) and child.get("properties"):
                out += unknown(value, child, f"{path}{key}.")
        return out

    assert unknown(values, schema, "") == []
