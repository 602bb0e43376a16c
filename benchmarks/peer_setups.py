"""The admission policies benchmarks/side_by_side.py compares, each set up on the test control
plane as its users deploy it, in a namespace of its own that only it judges.

  none             no policy: the apiserver's own cost of a Job create
  cel              a ValidatingAdmissionPolicy (benchmarks/peers/cel.yaml), in the apiserver: the
                   first shape its docs show, a ConfigMap of every name node status lists
  cel-best         the same as its best user writes it (benchmarks/peers/cel-best.yaml): every
                   node the Pod may land on, from a parameter of each node's cordon, labels, taints
                   and status images
  gatekeeper       OPA Gatekeeper's manager (--operation=webhook) with benchmarks/peers/gatekeeper.yaml,
                   the first shape its docs show: a Job's images against every name node status lists
  gatekeeper-best  the same manager with benchmarks/peers/gatekeeper-best.yaml: every node the Pod
                   may land on, from the synced Nodes
  kyverno          Kyverno's admission controller with benchmarks/peers/kyverno.yaml, the first
                   shape its docs show: a ClusterPolicy LISTing the Nodes on every review
  kyverno-best     the same controller with benchmarks/peers/kyverno-best.yaml: a CEL
                   ValidatingPolicy over a GlobalContextEntry that watches the Nodes
  image-preflight  the chart, `serve` and the node agent

Both shapes of Gatekeeper, and of Kyverno, are served by one process, each shape under a webhook
name of its own and judging a namespace of its own. Gatekeeper and Kyverno run as host processes
with a ServiceAccount's kubeconfig, as image-preflight does, so that API Priority and Fairness
treats the three alike (a ServiceAccount's requests fall in its "service-accounts" flow schema;
the admin's, in system:masters, are exempt). Their ServiceAccounts are bound to cluster-admin,
wider than their charts' roles, which changes what they may do but not how they are queued.
They run out of cluster as their docs allow (Gatekeeper's --debug-use-fake-pod), each behind the
Service its chart makes, so that
the apiserver reaches all three webhooks one way: a Service's ClusterIP over its cluster egress
(tests/controlplane/network.py). Each webhook keeps the failurePolicy and timeout its chart
gives it. Whatever a setup starts is handed to `stoppers` at once, so that a failed setup leaves
nothing running.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.builders.stalls import ENFORCE_LABEL
from tests.chart import API_ONLY, apply, merged, secret_values
from tests.controlplane.cluster import ControlPlane, Process, free_port, new_namespace, wait_for
from tests.controlplane.pki import Authority
from tests.controlplane.webhook import ServedWebhook

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ROOT / "benchmarks" / "peers"
BUILD = POLICIES / "build"
READY_S = 180.0

# The webhooks' names, as the apiserver's span names them.
GATEKEEPER_WEBHOOK = "validation.gatekeeper.sh"  # gatekeeper's chart
GATEKEEPER_BEST_WEBHOOK = "best.validation.gatekeeper.sh"  # the chart's webhook again, for the other shape
KYVERNO_WEBHOOK = "validate.kyverno.svc-fail"  # what Kyverno registers for an Enforce ClusterPolicy
KYVERNO_BEST_WEBHOOK = "vpol.validate.kyverno.svc-fail"  # and for a ValidatingPolicy that fails closed
IMAGE_PREFLIGHT_WEBHOOK = "validate.image-preflight.io"


class NotRunnable(Exception):
    """A peer that cannot be set up as written on this cluster; the message says why."""


def _message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body or "")["message"]
    except (ValueError, KeyError, TypeError):
        return str(exc.reason)


@dataclass
class Peer:
    name: str
    namespace: str
    webhook: str | None = None  # None: no webhook call (no policy, or CEL in the apiserver)
    pids: list[int] = field(default_factory=list)  # its own processes, for CPU and RSS


def peers_folder() -> Path:
    """Where benchmarks/peers/build put Gatekeeper and Kyverno (built on first use)."""
    done = subprocess.run([str(BUILD)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"benchmarks/peers/build failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _apply(plane: ControlPlane, documents: str | list[dict]) -> None:
    text = documents if isinstance(documents, str) else yaml.safe_dump_all(documents)
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=text)


def _crds(plane: ControlPlane, folder: Path) -> None:
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(folder))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(folder))


def _service(plane: ControlPlane, namespace: str, name: str, port: int) -> None:
    """A Service as the peer's chart makes it, its ClusterIP:443 reaching `port` on loopback."""
    plane.core().create_namespaced_service(namespace, {"metadata": {"name": name}, "spec": {
        "ports": [{"port": 443, "targetPort": port, "protocol": "TCP"}]}})
    cluster_ip = plane.core().read_namespaced_service(name, namespace).spec.cluster_ip
    plane.network.expose(f"{cluster_ip}:443", port)


def _service_account(plane: ControlPlane, namespace: str, name: str, folder: Path) -> Path:
    """A kubeconfig of ServiceAccount `namespace`/`name`, bound to cluster-admin."""
    core = plane.core()
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    k8s.RbacAuthorizationV1Api(core.api_client).create_cluster_role_binding({
        "metadata": {"name": f"{namespace}-{name}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "namespace": namespace, "name": name}]})
    return plane.service_account_kubeconfig(namespace, name, folder / f"{name}.kubeconfig")


def _webhook_tls(folder: Path, host: str) -> tuple[Path, Path]:
    """A CA and a serving certificate for `host`, as Gatekeeper's cert rotator would make them."""
    authority = Authority(folder)
    crt, key = authority.issue("serving", "webhook", server_names=(host,))
    shutil.copy(crt, folder / "tls.crt")
    shutil.copy(key, folder / "tls.key")
    return authority.cert_path, folder


def _namespace_selector(*names: str) -> dict:
    return {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(names)}]}


# --- no policy, and CEL ----------------------------------------------------------------------------

def no_policy(plane: ControlPlane) -> Peer:
    return Peer("none", new_namespace(plane, name="peer-none"))


def cel(plane: ControlPlane, node_images: list[str]) -> Peer:
    """The policy, its binding to one namespace, and its parameter: every name node status lists."""
    ns = new_namespace(plane, name="peer-cel")
    _apply(plane, [_cel_parameter(ns, node_images)])
    _apply(plane, (POLICIES / "cel.yaml").read_text())
    _bind(plane, "job-images-on-nodes", "node-images", ns)
    return Peer("cel", ns)


def _bind(plane: ControlPlane, policy: str, parameter: str, ns: str) -> None:
    """The policy's binding: denying in namespace `ns` alone, with `ns`/`parameter` its parameter."""
    _apply(plane, [{
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"],
                 "paramRef": {"name": parameter, "namespace": ns, "parameterNotFoundAction": "Deny"},
                 "matchResources": {"namespaceSelector": _namespace_selector(ns)}},
    }])


def cel_best(plane: ControlPlane) -> Peer:
    """The CRD of its parameter, the parameter written from the Nodes as they are now (what a
    refresher keeps current), the policy, and its binding to one namespace."""
    ns = new_namespace(plane, name="peer-cel-best")
    crd, policy = yaml.safe_load_all((POLICIES / "cel-best.yaml").read_text())
    _apply(plane, [crd])
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}")
    facts = {"apiVersion": "policy.example.com/v1", "kind": "NodeFacts", "metadata": {"name": "nodes", "namespace": ns},
             "spec": {"nodes": [node_facts(node) for node in plane.core().list_node().items]}}
    try:
        k8s.CustomObjectsApi(plane.api_client()).create_namespaced_custom_object(
            "policy.example.com", "v1", ns, "nodefacts", facts)
    except ApiException as exc:
        # One object holds every node: past the apiserver's request limit (3 MiB) or etcd's
        # (--max-request-bytes, 1.5 MiB by default) the refresher cannot write it at all.
        raise NotRunnable(f"its parameter of {len(facts['spec']['nodes'])} nodes "
                          f"({len(json.dumps(facts)) / 2**20:.1f} MiB) was refused: {exc.status} "
                          f"{_message(exc)}") from None
    _apply(plane, [policy])
    _bind(plane, policy["metadata"]["name"], "nodes", ns)
    return Peer("cel-best", ns)


def node_facts(node: k8s.V1Node) -> dict:
    """One node as cel-best's refresher copies it: what the scheduler filters on, and its status images."""
    return {"name": node.metadata.name, "unschedulable": bool(node.spec.unschedulable),
            "labels": dict(node.metadata.labels or {}),
            "taints": [{"key": t.key, "effect": t.effect, **({"value": t.value} if t.value else {})}
                       for t in node.spec.taints or ()],
            "images": {name: True for image in node.status.images or () for name in image.names or ()}}


def _cel_parameter(ns: str, node_images: list[str]) -> dict:
    """What a user's job would keep writing: every image name the Nodes list, a line each."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "node-images", "namespace": ns},
            "data": {"images": "\n".join(sorted(set(node_images)))}}


# --- Gatekeeper ------------------------------------------------------------------------------------



def gatekeeper(plane: ControlPlane, binaries: Path, folder: Path, stoppers: list, shapes: list[str]) -> list[Peer]:
    """One Gatekeeper for the `shapes` asked ("gatekeeper", "gatekeeper-best"), each constraint
    matching its own namespace, each judged through a webhook of the chart's of its own name."""
    folder.mkdir(parents=True, exist_ok=True)
    _crds(plane, binaries / "crds" / "gatekeeper")
    new_namespace(plane, name="gatekeeper-system")
    port = free_port()
    ca, cert_dir = _webhook_tls(folder, "gatekeeper-webhook-service.gatekeeper-system.svc")
    _service(plane, "gatekeeper-system", "gatekeeper-webhook-service", port)
    kubeconfig = _service_account(plane, "gatekeeper-system", "gatekeeper-admin", folder)  # its chart's
    process = Process("gatekeeper", [
        str(binaries / "gatekeeper"), f"--kubeconfig={kubeconfig}",
        "--operation=webhook", "--operation=generate", "--exempt-namespace=gatekeeper-system",  # its chart's
        f"--port={port}", f"--cert-dir={cert_dir}", "--disable-cert-rotation", "--debug-use-fake-pod",
        f"--health-addr=127.0.0.1:{free_port()}", f"--prometheus-port={free_port()}",
        "--enable-external-data=false", "--log-level=INFO",
    ], folder / "gatekeeper.log")
    process.start(env={**os.environ, "POD_NAMESPACE": "gatekeeper-system", "POD_NAME": "gatekeeper-controller-0"})
    stoppers.append(process.stop)
    peers, webhooks = [], []
    for shape in shapes:
        best = shape == "gatekeeper-best"
        ns = new_namespace(plane, name=f"peer-{shape}")
        *sync_and_template, constraint = yaml.safe_load_all(
            (POLICIES / ("gatekeeper-best.yaml" if best else "gatekeeper.yaml")).read_text())
        _apply(plane, sync_and_template)
        kind = sync_and_template[-1]["metadata"]["name"]
        wait_for(lambda: _established(plane, f"{kind}.constraints.gatekeeper.sh"),
                 "Gatekeeper made the constraint's CRD", timeout_s=READY_S)
        constraint["spec"]["match"]["namespaces"] = [ns]
        _apply(plane, [constraint])
        name = GATEKEEPER_BEST_WEBHOOK if best else GATEKEEPER_WEBHOOK
        rules = [{"apiGroups": ["batch"], "apiVersions": ["*"], "resources": ["jobs"],
                  "operations": ["CREATE", "UPDATE"], "scope": "*"}]
        if best:
            rules.append({"apiGroups": [""], "apiVersions": ["*"], "resources": ["pods"],
                          "operations": ["CREATE"], "scope": "*"})
        # The chart's webhook, its rules narrowed to what the shape judges and its namespaceSelector to one namespace.
        webhooks.append({
            "name": name, "admissionReviewVersions": ["v1", "v1beta1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 3, "matchPolicy": "Exact",
            "clientConfig": {"service": {"name": "gatekeeper-webhook-service", "namespace": "gatekeeper-system",
                                         "path": "/v1/admit"},
                             "caBundle": base64.b64encode(ca.read_bytes()).decode()},
            "namespaceSelector": _namespace_selector(ns), "rules": rules})
        peers.append(Peer(shape, ns, name, [process.popen.pid]))
    _apply(plane, [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": "gatekeeper-validating-webhook-configuration"}, "webhooks": webhooks}])
    return peers


def _established(plane: ControlPlane, crd: str) -> bool:
    return plane.kubectl("get", f"crd/{crd}", check=False).returncode == 0


# --- Kyverno ---------------------------------------------------------------------------------------



def kyverno(plane: ControlPlane, binaries: Path, folder: Path, stoppers: list, shapes: list[str]) -> list[Peer]:
    """One Kyverno for the `shapes` asked ("kyverno", "kyverno-best"), each policy matching its own
    namespace; Kyverno registers a webhook for each kind of policy."""
    folder.mkdir(parents=True, exist_ok=True)
    namespaces = {shape: new_namespace(plane, name=f"peer-{shape}") for shape in shapes}
    _crds(plane, binaries / "crds" / "kyverno")
    new_namespace(plane, name="kyverno")
    kubeconfig = _service_account(plane, "kyverno", "kyverno-admission-controller", folder)  # its chart's
    # Its chart's ConfigMaps; `webhooks` gives its webhooks one namespace (the chart's key).
    _apply(plane, [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kyverno", "namespace": "kyverno"},
         "data": {"webhooks": json.dumps({"namespaceSelector": _namespace_selector(*namespaces.values())}),
                  "resourceFilters": "[Event,*,*][*/*,kube-system,*][*/*,kube-public,*][*/*,kube-node-lease,*]"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kyverno-metrics", "namespace": "kyverno"},
         "data": {}},
    ])
    # In a cluster Kyverno reads its Deployment's replicas before it registers webhooks
    # (pkg/utils/runtime, IsRollingUpdate): the chart's Deployment, its Pod on no node.
    labels = {"app.kubernetes.io/component": "admission-controller", "app.kubernetes.io/instance": "kyverno"}
    _apply(plane, [{"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "kyverno-admission-controller", "namespace": "kyverno"},
                    "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                        "metadata": {"labels": labels},
                        "spec": {"nodeSelector": {"image-preflight.test/no-such-node": "true"},
                                 "containers": [{"name": "kyverno", "image": "kyverno:benchmark"}]}}}}])
    port = free_port()
    _service(plane, "kyverno", "kyverno-svc", port)
    process = Process("kyverno", [
        str(binaries / "kyverno"), f"--kubeconfig={kubeconfig}", "--webhookServerHost=127.0.0.1",
        f"--webhookServerPort={port}",
        "--caSecretName=kyverno-svc.kyverno.svc.kyverno-tls-ca",
        "--tlsSecretName=kyverno-svc.kyverno.svc.kyverno-tls-pair",
        "--backgroundServiceAccountName=system:serviceaccount:kyverno:kyverno-background-controller",
        "--reportsServiceAccountName=system:serviceaccount:kyverno:kyverno-reports-controller",
        f"--metricsPort={free_port()}", f"--profilePort={free_port()}", "--disableMetrics",
        "--controllerRuntimeMetricsAddress=0", "--admissionReports=false", "--loggingFormat=json", "-v=1",
    ], folder / "kyverno.log")
    process.start(env={**os.environ, "KYVERNO_NAMESPACE": "kyverno",
                       "KYVERNO_SERVICEACCOUNT_NAME": "kyverno-admission-controller",
                       "KYVERNO_DEPLOYMENT": "kyverno-admission-controller",
                       "KYVERNO_POD_NAME": "kyverno-admission-controller-0",
                       "KYVERNO_SVC": "kyverno-svc", "INIT_CONFIG": "kyverno", "METRICS_CONFIG": "kyverno-metrics"})
    stoppers.append(process.stop)
    peers = []
    for shape, ns in namespaces.items():
        if shape == "kyverno-best":
            entry, policy = yaml.safe_load_all((POLICIES / "kyverno-best.yaml").read_text())
            policy["spec"]["matchConstraints"]["namespaceSelector"] = _namespace_selector(ns)
            _apply(plane, [entry, policy])
            peers.append(Peer(shape, ns, KYVERNO_BEST_WEBHOOK, [process.popen.pid]))
        else:
            policy = yaml.safe_load((POLICIES / "kyverno.yaml").read_text())
            for match in policy["spec"]["rules"][0]["match"]["any"]:
                match["resources"]["namespaces"] = [ns]
            # A ClusterPolicy's webhook takes the ConfigMap's namespaceSelector, which a
            # ValidatingPolicy's must share (Kyverno merges the two): without this condition the
            # apiserver would call it for the other shape's Jobs too.
            policy["spec"]["webhookConfiguration"] = {"matchConditions": [
                {"name": "its-namespace", "expression": f"request.namespace == '{ns}'"}]}
            _apply(plane, [policy])
            peers.append(Peer(shape, ns, KYVERNO_WEBHOOK, [process.popen.pid]))
    return peers


# --- image-preflight -------------------------------------------------------------------------------

def image_preflight(plane: ControlPlane, folder: Path, stoppers: list) -> Peer:
    """The chart with a certificate of `image-preflight certs`, and `serve` as its ServiceAccount.
    The agents are started by the caller, one per node with a runtime."""
    from image_preflight.cli import main as cli

    folder.mkdir(parents=True, exist_ok=True)
    certs = folder / "certs"
    if cli(["certs", "--service", "image-preflight", "--namespace", "image-preflight", "--out-dir", str(certs)]):
        raise SystemExit("image-preflight certs failed")
    apply(plane, merged(API_ONLY, secret_values(certs)), workloads=False)
    ns = new_namespace(plane, ENFORCE_LABEL, name="peer-image-preflight")
    served = ServedWebhook(plane, certs, plane.service_account_kubeconfig(
        "image-preflight", "image-preflight", folder / "serve.kubeconfig"), folder / "serve.log")
    stoppers.append(served.stop)
    served.start()
    return Peer("image-preflight", ns, IMAGE_PREFLIGHT_WEBHOOK, [served.popen.pid])


def agent(plane: ControlPlane, node: str, cri_endpoint: str, folder: Path, stoppers: list) -> int:
    """`image-preflight agent --publish` for `node`, as the chart's DaemonSet runs it; its pid."""
    kubeconfig = plane.service_account_kubeconfig("image-preflight-agent", "image-preflight-agent",
                                                  folder / f"agent-{node}.kubeconfig")
    process = Process(f"agent {node}", [
        sys.executable, "-m", "image_preflight", "agent", "--publish", "--node", node,
        "--cri-endpoint", cri_endpoint, "--kubeconfig", str(kubeconfig)], folder / f"agent-{node}.log")
    process.start()
    stoppers.append(process.stop)
    return process.popen.pid


def published(plane: ControlPlane, node: str) -> dict | None:
    try:
        return k8s.CustomObjectsApi(plane.core().api_client).get_cluster_custom_object(
            "image-preflight.io", "v1alpha1", "nodeimages", node)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
