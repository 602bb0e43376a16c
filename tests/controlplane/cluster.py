"""A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler, built from their Go modules by `tests/controlplane/build` and found on PATH.

No kubelet runs. Nodes are API objects whose status the tests write through the status
subresource, and whose Leases a heartbeat renews, as kwok does; so the node lifecycle
controller keeps them Ready and lifts the not-ready taint that admission puts on new Nodes.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from tests.controlplane.network import ClusterNetwork
from tests.controlplane.pki import Authority, service_account_keys
from tests.controlplane.tracing import tracing_configuration
from tests.needs import unavailable

NODEIMAGES_CRD = "crd/nodeimages.image-preflight.io"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet-configz")
SERVICE_CIDR = "10.0.0.0/24"
START_DEADLINE_S = 120.0
HEARTBEAT_S = 5.0
NODE_LEASE_NAMESPACE = "kube-node-lease"
AUDITED_NAMESPACES = ("image-preflight", "image-preflight-agent")
# The node lifecycle controller lifts a new node's not-ready taint at its next pass (default 5 s).
_CONTROLLER_FLAGS = ("--node-monitor-period=2s",)


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def require_control_plane() -> None:
    missing = missing_binaries()
    if missing:
        reason = (f"control plane binaries not on PATH ({', '.join(missing)}): "
                  "run tests/controlplane/build and put the folder it prints on PATH")
        unavailable(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def terminate(popen: subprocess.Popen | None) -> None:
    """SIGTERM, as the kubelet stops a container; SIGKILL after 15 s."""
    if popen is None or popen.poll() is not None:
        return
    popen.send_signal(signal.SIGTERM)
    try:
        popen.wait(timeout=15)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


class Process:
    """One control-plane binary, its output in a log file."""

    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name, self.args, self.log = name, args, log
        self.popen: subprocess.Popen | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        terminate(self.popen)

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def kubeconfig_document(server: str, ca: Path, user: dict, name: str = "test") -> dict:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }


def write_kubeconfig(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    path.chmod(0o600)
    return path


class ControlPlane:
    def __init__(self, folder: Path, *, tracing_endpoint: str | None = None) -> None:
        """`tracing_endpoint`: an OTLP/gRPC receiver (tests/controlplane/tracing.py) the apiserver
        sends a span of every request to."""
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.network = ClusterNetwork(folder / "cluster-network.sock")
        self.ca = Authority(folder)
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        serving = self.ca.issue("apiserver", "kube-apiserver", server_names=(
            "127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc"))
        admin_crt, admin_key = self.ca.issue("admin", "image-preflight-test-admin", org="system:masters")
        # How the apiserver authenticates to kubelets (node proxy: configz, logs, stats/summary).
        kubelet_client = self.ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                       org="system:masters")
        self._admin_tls = ssl.create_default_context(cafile=str(self.ca.cert_path))
        self._admin_tls.load_cert_chain(admin_crt, admin_key)
        self.kubeconfig = write_kubeconfig(folder / "admin.kubeconfig", kubeconfig_document(
            self.url, self.ca.cert_path,
            {"client-certificate-data": base64.b64encode(admin_crt.read_bytes()).decode(),
             "client-key-data": base64.b64encode(admin_key.read_bytes()).decode()}))
        sa_public, sa_private = service_account_keys(folder)
        egress = folder / "egress.yaml"
        egress.write_text(yaml.safe_dump({
            "apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
            "egressSelections": [{"name": "cluster", "connection": {
                "proxyProtocol": "HTTPConnect", "transport": {"uds": {"udsName": str(self.network.socket_path)}}}}],
        }))
        # What the project's service accounts ask of the apiserver, to prove their roles minimal.
        audit_policy = folder / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata",
                       "userGroups": [f"system:serviceaccounts:{ns}" for ns in AUDITED_NAMESPACES]},
                      {"level": "None"}],
        }))
        self.audit_log = folder / "audit.log"
        self.etcd = Process("etcd", [
            "etcd", "--name=test", f"--data-dir={folder / 'etcd'}", "--log-level=warn",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-cluster=test=http://127.0.0.1:{self.etcd_peer_port}",
            "--unsafe-no-fsync",  # a throwaway store: fsync only slows the tests
        ], folder / "etcd.log")
        self.apiserver = Process("kube-apiserver", [
            "kube-apiserver", f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}", "--advertise-address=127.0.0.1",
            f"--tls-cert-file={serving[0]}", f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={self.ca.cert_path}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_public}", f"--service-account-signing-key-file={sa_private}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            f"--egress-selector-config-file={egress}",
            f"--audit-policy-file={audit_policy}", f"--audit-log-path={self.audit_log}",
            # The kubernetes Service's endpoint would be 127.0.0.1, which EndpointSlices may not hold.
            "--endpoint-reconciler-type=none",
            f"--kubelet-client-certificate={kubelet_client[0]}", f"--kubelet-client-key={kubelet_client[1]}",
            "--kubelet-preferred-address-types=InternalIP",
            *([f"--tracing-config-file={tracing_configuration(folder / 'tracing.yaml', tracing_endpoint)}"]
              if tracing_endpoint else []),
            "-v=1",
        ], folder / "kube-apiserver.log")
        self.controller_manager = Process("kube-controller-manager", [
            "kube-controller-manager", f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
            f"--service-account-private-key-file={sa_private}", f"--root-ca-file={self.ca.cert_path}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", *_CONTROLLER_FLAGS, "-v=1",
        ], folder / "kube-controller-manager.log")
        self.scheduler = Process("kube-scheduler", [
            "kube-scheduler", f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false", "-v=1",
        ], folder / "kube-scheduler.log")
        self.processes = [self.etcd, self.apiserver, self.controller_manager, self.scheduler]
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="node-heartbeat", daemon=True)
        self.heartbeat_errors = 0

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.etcd.start()
        self._wait(self.etcd, self._etcd_healthy)
        self.apiserver.start()
        self._wait(self.apiserver, self.ready)
        self.controller_manager.start()
        self.scheduler.start()
        self._wait(self.controller_manager, self._default_service_account)
        self._heartbeat.start()

    def stop(self) -> None:
        self._stop.set()
        for process in reversed(self.processes):
            process.stop()
        self.network.close()

    def restart_apiserver(self) -> None:
        self.apiserver.stop()
        self.apiserver.start()
        self._wait(self.apiserver, self.ready)

    def _wait(self, process: Process, condition, deadline_s: float = START_DEADLINE_S) -> None:
        deadline = time.monotonic() + deadline_s
        while not condition():
            process.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{process.name} not ready after {deadline_s:.0f} s:\n{process.tail()}")
            time.sleep(0.1)

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as answer:
                return json.load(answer).get("health") == "true"
        except OSError:
            return False

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", context=self._admin_tls, timeout=2) as answer:
                return answer.status == 200
        except OSError:  # refused while starting, 500 until every post-start hook has run
            return False

    def _default_service_account(self) -> bool:
        try:
            self.core().read_namespaced_service_account("default", "default", _request_timeout=2)
            return True
        except Exception:
            return False

    # --- clients -----------------------------------------------------------------------------------

    def api_client(self, kubeconfig: Path | None = None) -> k8s.ApiClient:
        return k8s_config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def core(self) -> k8s.CoreV1Api:
        if not hasattr(self, "_core"):
            self._core = k8s.CoreV1Api(self.api_client())
        return self._core

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
                                input=input, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        """A kubeconfig that acts as the ServiceAccount, with a token from the TokenRequest API."""
        request = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
        token = self.core().create_namespaced_service_account_token(name, namespace, request).status.token
        return write_kubeconfig(path, kubeconfig_document(self.url, self.ca.cert_path, {"token": token}))

    def audited_requests(self, kubeconfig: Path) -> list[dict]:
        """The resource requests made with the token in `kubeconfig` (one of
        service_account_kubeconfig's), from the audit log: group, resource, subresource, verb, code,
        stage and requestURI. A watch is logged twice: ResponseStarted as it opens, ResponseComplete
        as it ends."""
        credential = [f"JTI={token_id(kubeconfig)}"]
        found = []
        if not self.audit_log.exists():
            return found
        for line in self.audit_log.read_text(errors="replace").splitlines():
            event = json.loads(line)
            ref = event.get("objectRef")
            extra = event.get("user", {}).get("extra", {})
            if extra.get("authentication.kubernetes.io/credential-id") != credential or ref is None:
                continue
            found.append({"group": ref.get("apiGroup", ""), "resource": ref.get("resource", ""),
                          "subresource": ref.get("subresource", ""), "verb": event["verb"],
                          "code": event.get("responseStatus", {}).get("code", 0),
                          "stage": event["stage"], "requestURI": event["requestURI"]})
        return found

    # --- etcd --------------------------------------------------------------------------------------

    def etcd_revision(self) -> int:
        return int(self._etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision, as the apiserver's compactor does."""
        revision = self.etcd_revision()
        self._etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def _etcd(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    # --- nodes -------------------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        coordination = k8s.CoordinationV1Api(self.api_client())
        while not self._stop.wait(HEARTBEAT_S):
            try:
                for node in self.core().list_node(_request_timeout=10).items:
                    renew_lease(coordination, node.metadata.name, node.metadata.uid)
            except Exception:  # the apiserver restarting; the next beat tries again
                self.heartbeat_errors += 1


def request_query(request: dict) -> dict[str, str]:
    """The query parameters of one of audited_requests' entries."""
    return dict(parse_qsl(urlsplit(request["requestURI"]).query))


def token_id(kubeconfig: Path) -> str:
    """The `jti` claim of the kubeconfig's service-account token: what the audit log names it by."""
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"]


def _micro_time() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def renew_lease(coordination: k8s.CoordinationV1Api, node: str, uid: str) -> None:
    """What the kubelet does every 10 s: renew the Node's Lease in kube-node-lease."""
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": _micro_time()}}
    try:
        coordination.patch_namespaced_lease(node, NODE_LEASE_NAMESPACE, {"spec": body["spec"]},
                                            _request_timeout=10)
    except ApiException as exc:
        if exc.status != 404:
            raise
        coordination.create_namespaced_lease(NODE_LEASE_NAMESPACE, body, _request_timeout=10)


def node_status(images: list[list[str]], *, ready: bool = True) -> dict:
    """A Node status as a kubelet would post it; `images` lists each image's names."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                        "lastTransitionTime": now}],
        "images": [{"names": names, "sizeBytes": 1 << 20} for names in images],
    }


NOT_READY = "node.kubernetes.io/not-ready"
# Nodes of one test must not take the Pods of another: unless a test asks for other taints, its
# nodes carry this one, which no Pod tolerates.
PARKED = {"key": "image-preflight.test/parked", "value": "true", "effect": "NoSchedule"}


def create_node(plane: ControlPlane, name: str, *, images: list[list[str]] | None = None,
                labels: dict | None = None, taints: list[dict] | None = None, unschedulable: bool = False,
                wait_ready: bool = True, ready: bool = True) -> dict:
    """Create a Node through the API and post its status as its kubelet would; by default wait
    until the node lifecycle controller has lifted the not-ready taint admission gave it.
    `taints` defaults to [PARKED]; pass [] for a node any Pod may land on. Not `ready`: its
    status says so, and the not-ready taint stays."""
    if taints is None:
        taints = [PARKED]
    core = plane.core()
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  **(labels or {})}},
            "spec": {"taints": taints, "unschedulable": unschedulable}}
    node = core.create_node(body)
    renew_lease(k8s.CoordinationV1Api(core.api_client), name, node.metadata.uid)
    core.patch_node_status(name, {"status": node_status(images or [], ready=ready)})
    if wait_ready and ready:
        wait_for(lambda: not any(t.key == NOT_READY for t in core.read_node(name).spec.taints or ()),
                 f"node {name}: the not-ready taint is lifted")
    return core.read_node(name).to_dict()


def new_namespace(plane: ControlPlane, labels: dict | None = None, *, rollout_scripts: bool = False,
                  name: str | None = None) -> str:
    """A namespace with `labels`, of a fresh name unless `name` is given; with `rollout_scripts`,
    the ConfigMap agent-lightning's SWE-smith template mounts beside the image."""
    name = name or f"e2e-{uuid.uuid4().hex[:8]}"
    core = plane.core()
    core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
    if rollout_scripts:
        core.create_namespaced_config_map(name, {"metadata": {"name": "swe-smith-agent-scripts"},
                                                 "data": {"smith_agent.py": "print('rollout')\n"}})
    return name


def delete_namespaces(plane: ControlPlane, namespaces: list[str]) -> None:
    """A test's namespaces, with their Jobs and Pods gone at once (no kubelet would end the Pods)."""
    core = plane.core()
    batch = k8s.BatchV1Api(core.api_client)
    for namespace in namespaces:
        batch.delete_collection_namespaced_job(namespace, propagation_policy="Background")
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_namespace(namespace)


def set_node_images(plane: ControlPlane, name: str, images: list[list[str]]) -> None:
    plane.core().patch_node_status(name, {"status": {"images": [{"names": n, "sizeBytes": 1 << 20} for n in images]}})


@contextlib.contextmanager
def kubelet_configz(plane: ControlPlane, node: str, address: str, *, max_images: int | None = None) -> Iterator[None]:
    """Serve `node`'s kubelet configz (cmd/kubelet-configz) where the apiserver's node proxy looks
    for it: `address` (an InternalIP of the cluster network) at the kubelet port in node status.
    `max_images` None leaves nodeStatusMaxImages to the kubelet's default."""
    command = ["kubelet-configz", "--listen", "127.0.0.1:0"]
    if max_images is not None:
        command += ["--node-status-max-images", str(max_images)]
    popen = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                             text=True)
    try:
        port = int(popen.stdout.readline().rsplit(":", 1)[1])  # type: ignore[union-attr]  # stdout=PIPE
        plane.core().patch_node_status(node, {"status": {
            # InternalIP only: the apiserver tries Hostname first, and no name resolves here.
            "addresses": [{"type": "InternalIP", "address": address}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}}}})
        plane.network.expose(f"{address}:{KUBELET_PORT}", port)
        yield
    finally:
        plane.network.withdraw(f"{address}:{KUBELET_PORT}")
        terminate(popen)


KUBELET_PORT = 10250


def unreachable_kubeconfig(path: Path) -> Path:
    """A kubeconfig for an apiserver that is not there (a closed port)."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "gone", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "gone"}}]}))
    return path


def wait_for(condition, what: str, timeout_s: float = 60.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for: {what}")
        time.sleep(interval_s)


@contextlib.contextmanager
def running_control_plane(folder: Path, *, tracing_endpoint: str | None = None) -> Iterator[ControlPlane]:
    require_control_plane()
    plane = ControlPlane(folder, tracing_endpoint=tracing_endpoint)
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


SHARED: list[ControlPlane] = []  # the session's control_plane (tests/plugins/control_plane.py), once started


def open_nodes() -> set[str]:
    """The shared cluster's Nodes a Pod without a nodeSelector or tolerations may land on:
    schedulable, with no NoSchedule or NoExecute taint (none before the cluster starts)."""
    if not SHARED:
        return set()
    return {node.metadata.name for node in SHARED[0].core().list_node().items
            if not node.spec.unschedulable
            and not any(t.effect in ("NoSchedule", "NoExecute") for t in node.spec.taints or ())}


def apply_service_accounts(plane: ControlPlane) -> None:
    """The chart's ServiceAccounts with their roles, the NodeImages CRD and the agent's namespace:
    the webhook's image-preflight/image-preflight, the node agent's
    image-preflight-agent/image-preflight-agent (with pinning's Role), the watchdog's. Applied as
    tests.chart.apply applies the whole chart, so that a later apply of it agrees with them."""
    from tests.chart import API_ONLY, apply

    apply(plane, API_ONLY, kinds=("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                  "RoleBinding"))


CASE_LABEL = "image-preflight.test/case"


class Case:
    """What one test puts in the shared cluster: named with its suffix, labelled with its label,
    and deleted when it ends (Nodes and RuntimeClasses by label, NodeImages by name)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.id = uuid.uuid4().hex[:8]
        self.labels = {CASE_LABEL: self.id}
        self.selector = f"{CASE_LABEL}={self.id}"

    def name(self, base: str) -> str:
        return f"{base}-{self.id}"

    def node(self, base: str, *, labels: dict | None = None, **options) -> dict:
        """create_node for this case: named name(base), carrying its label."""
        return create_node(self.plane, self.name(base), labels={**self.labels, **(labels or {})}, **options)

    def wait_ready(self) -> None:
        """Until the node lifecycle controller has lifted the not-ready taint from every node of
        this case, so that nothing but the test writes them any more."""
        core = self.plane.core()
        wait_for(lambda: not any(t.key == NOT_READY for n in core.list_node(label_selector=self.selector).items
                                 for t in n.spec.taints or ()), f"the nodes of case {self.id} are ready")

    def clean_up(self) -> None:
        core = self.plane.core()
        core.delete_collection_node(label_selector=self.selector)
        k8s.NodeV1Api(core.api_client).delete_collection_runtime_class(label_selector=self.selector)
        custom = k8s.CustomObjectsApi(core.api_client)
        try:
            custom.delete_collection_cluster_custom_object(
                "image-preflight.io", "v1alpha1", "nodeimages", label_selector=self.selector)
            for obj in custom.list_cluster_custom_object("image-preflight.io", "v1alpha1", "nodeimages")["items"]:
                if obj["metadata"]["name"].endswith("-" + self.id):
                    custom.delete_cluster_custom_object("image-preflight.io", "v1alpha1", "nodeimages",
                                                        obj["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:  # 404: the CRD is not installed, so there is nothing to delete
                raise
