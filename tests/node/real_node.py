"""A real node for the tests: containerd 2.x, runc and a kubelet, registered with a control plane.

`tests/controlplane/build` builds the kubelet and kube-proxy (the control plane's Go module) and
containerd 2.x (`containerd/` of the folder it prints); runc, the CNI plugins, iptables and busybox
are Debian's. The node runs in a network namespace of its own (tests/node/netns.py) and every
registry resolves to a stub on that namespace's loopback (tests/node/stub_registry.py), so a pull
of an absent image fails as it does on a node whose image was built locally and never pushed.

Its Pods reach Services as in a cluster: kube-proxy (iptables mode) programs the node's namespace.
The `kubernetes` Service's endpoint is the relay to the apiserver on the host side of the veth
(the apiserver's own reconciler would name 127.0.0.1, which an EndpointSlice may not hold). The
host routes the Service and Pod subnets to the node, and the apiserver's cluster egress dials
them as they are: a webhook Service's ClusterIP reaches its Pods through the node's kube-proxy. Teardown restores what
the kubelet changes on the host, checks that nothing is left behind, and fails the run when
containerd dialled or resolved anything but the stub, or a registry of the test's own that
it was told to trust (RealNode.trust_registry).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import kubernetes.client as k8s
import yaml

from image_preflight.agent.cri import ImageClient
from tests.containerd import outside_requests, write_hosts_toml
from tests.controlplane.cluster import (
    KUBELET_PORT,
    SERVICE_CIDR,
    ControlPlane,
    Process,
    kubeconfig_document,
    require_control_plane,
    running_control_plane,
    terminate,
    wait_for,
    write_kubeconfig,
)
from tests.controlplane.network import TcpRelay
from tests.needs import unavailable
from tests.node import netns
from tests.node.images import PAUSE_NAME, busybox_missing, write_images

NAMESPACE = "k8s.io"
NODE_NAME = "real-node"
# What the kubelet changes on the host (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables).
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
CONTAINER_LOG_LINKS = Path("/var/log/containers")  # the kubelet's fixed ContainerLogsDir
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
RUN_CONTAINERD = Path("/run/containerd")  # the shims' sockets live under s/ whatever the config says
AGL_LOGS = Path("/agl-logs")  # the hostPath agent-lightning's SWE-smith template mounts
DEBIAN_TOOLS = {"runc": "runc", "nsenter": "util-linux", "ip": "iproute2", "iptables-restore": "iptables",
                "mkfs.ext4": "e2fsprogs", "losetup": "mount"}
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
READY_DEADLINE_S = 90.0
# containerd's root lives on a filesystem of the node's own, so that the kubelet's image GC and
# doctor judge a disk the tests control (tests/cluster/test_real_node_gc.py fills it). Sparse: the host
# disk holds only what is written. The built image-preflight image (about 0.8 GB unpacked, with
# its layers) and the other tests' images stay well under the default 85 %.
IMAGEFS_BYTES = 4 * 2**30

_CONTAINERD_CONFIG = """\
version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.blockfile",
                    "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  # The resolver's and fetcher's lines are at debug: teardown reads them to prove every request
  # went to the stub.
  level = "debug"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{hosts}"

[plugins."io.containerd.cri.v1.runtime"]
  disable_apparmor = true
  # Root lacks CAP_SYS_RESOURCE in these VMs: runc cannot lower its own OOM score otherwise.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "{runc}"
      Root = "{state}/runc"
      SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def missing_parts() -> str | None:
    """Why a real node cannot start here, or None."""
    if os.geteuid() != 0:
        return "a real node needs root"
    for tool, package in DEBIAN_TOOLS.items():
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install {package})"
    if not (CNI_BIN / "bridge").exists():
        return f"no CNI plugins in {CNI_BIN} (apt-get install containernetworking-plugins)"
    if (reason := busybox_missing()) is not None:
        return reason
    kubelet = shutil.which("kubelet")
    if kubelet is None or shutil.which("kube-proxy") is None or not (
            Path(kubelet).parent / "containerd" / "containerd").exists():
        return ("kubelet, kube-proxy or containerd 2.x not built: run tests/controlplane/build and put the"
                " folder it prints on PATH")
    netns.remove_leftovers()
    for tree in _cgroup_trees(KUBEPODS):  # a killed run's, if nothing runs in it any more
        try:
            _remove_cgroup(tree)
        except OSError:
            return f"{tree} is in use: another kubelet runs here"
    if netns.host_addresses_in_use():
        return f"{netns.HOST_ADDRESS} is already held on this host (another real node, or one left behind)"
    return None


def require_real_node() -> None:
    require_control_plane()
    if (reason := missing_parts()) is not None:
        unavailable(reason)


def _read_sysctls() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in SYSCTLS}


def mounts_under(prefixes: Sequence[str]) -> list[str]:
    """Mount points at or below any of `prefixes`."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            found.append(point)
    return found


def _cgroup_trees(name: str) -> list[Path]:
    return [d / name for d in CGROUP_ROOT.iterdir() if not d.is_symlink() and (d / name).is_dir()]


def _remove_cgroup(tree: Path) -> None:
    """rmdir depth first: cgroupfs folders hold only the kernel's files, which cannot be unlinked."""
    for folder in sorted((p for p in tree.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        folder.rmdir()
    tree.rmdir()


def _processes_mentioning(text: str) -> list[str]:
    done = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True, check=False)
    return [line for line in done.stdout.splitlines() if str(os.getpid()) != line.split()[0]]


class RealNode:
    """containerd, the stub registry and a kubelet in a network namespace, registered as `name`."""

    def __init__(self, plane: ControlPlane, *, name: str = NODE_NAME, max_images: int | None = None,
                 kubelet_config: dict | None = None) -> None:
        self.plane = plane
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix="ipfn-", dir="/tmp"))  # short: AF_UNIX paths
        bin_dir = Path(shutil.which("kubelet") or "kubelet").parent
        self.containerd_bin = bin_dir / "containerd" / "containerd"
        self.socket = self.dir / "containerd.sock"
        self.endpoint = f"unix://{self.socket}"
        self.address = netns.NODE_ADDRESS
        self.max_images = max_images
        self.extra_config = kubelet_config or {}
        self.registry_log = self.dir / "registry.log"
        self.network: netns.NodeNetwork | None = None
        self.relay: TcpRelay | None = None
        self.registry: subprocess.Popen | None = None
        self.containerd: Process | None = None
        self.kubelet: Process | None = None
        self.kube_proxy: Process | None = None
        self._sysctls = _read_sysctls()
        self._had = {path: path.exists() for path in (CONTAINER_LOG_LINKS, RUN_CONTAINERD, AGL_LOGS)}
        self.registry_port = 0
        self.trusted: list[str] = []  # registries of the test's own it may pull from (trust_registry)
        self.imagefs = self.dir / "imagefs"  # the mount point; containerd's root is in it
        self._imagefs_file = self.dir / "imagefs.ext4"

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.network = netns.create_node_network()
        self._start_registry()
        self._make_imagefs()
        self._start_containerd()
        self.import_images([PAUSE_NAME], pause=True)
        self._start_kubelet()
        self._start_service_network()

    def stop(self) -> list[str]:
        """Everything undone; what could not be, as lines (running_real_node raises TeardownError on any)."""
        problems: list[str] = []

        def attempt(what: str, action) -> None:
            try:
                action()
            except Exception as exc:  # teardown goes on: each step undoes its own part
                problems.append(f"{what}: {exc}")

        attempt("pods removed", self._remove_pods)
        if self.kube_proxy is not None:
            attempt("kube-proxy stopped", self.kube_proxy.stop)
        if self.kubelet is not None:
            attempt("kubelet stopped", self.kubelet.stop)
        attempt("tasks killed", self._kill_tasks)
        if self.containerd is not None:
            attempt("containerd stopped", self.containerd.stop)
        attempt("shims stopped", self._kill_leftovers)
        attempt("mounts removed", self._unmount)
        if self.registry is not None:
            attempt("registry stopped", lambda: terminate(self.registry))
        if self.relay is not None:
            attempt("relay closed", self.relay.close)
        if self.network is not None:
            attempt("network removed", self.network.close)
        attempt("cgroups removed", lambda: [_remove_cgroup(t) for t in _cgroup_trees(KUBEPODS)])
        attempt("sysctls restored", self._restore_sysctls)
        attempt("host folders removed", self._remove_host_folders)
        attempt("node deleted", lambda: self.plane.core().delete_node(self.name))
        problems += self.leftovers()
        if not problems:
            shutil.rmtree(self.dir, ignore_errors=True)
        return problems

    def leftovers(self) -> list[str]:
        found = [f"process left: {p}" for p in _processes_mentioning(str(self.dir))]
        found += [f"mount left: {m}" for m in mounts_under([str(self.dir)])]
        found += [f"cgroup left: {t}" for t in _cgroup_trees(KUBEPODS)]
        found += [f"loop device left: {line}" for line in _loop_devices(self._imagefs_file)]
        if self.network is not None and Path(self.network.path).exists():
            found.append(f"network namespace left: {self.network.name}")
        if netns.host_addresses_in_use():
            found.append(f"host address left: {netns.HOST_ADDRESS}")
        now = _read_sysctls()
        found += [f"sysctl {k} is {now[k]}, was {v}" for k, v in self._sysctls.items() if now[k] != v]
        return found

    # --- parts -------------------------------------------------------------------------------------

    def _start_registry(self) -> None:
        assert self.network is not None
        port_file = self.dir / "registry.port"
        root = Path(__file__).resolve().parents[2]
        self.registry = subprocess.Popen(
            self.network.enter([sys.executable, "-m", "tests.node.stub_registry", str(port_file),
                                str(self.registry_log)]),
            cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        wait_for(port_file.exists, "the stub registry listens", timeout_s=20)
        self.registry_port = int(port_file.read_text())

    def _make_imagefs(self) -> None:
        self.imagefs.mkdir()
        with open(self._imagefs_file, "wb") as image:
            image.truncate(IMAGEFS_BYTES)
        # No blocks reserved for root: the kubelet counts used as capacity minus available.
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self._imagefs_file)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(self._imagefs_file), str(self.imagefs)], check=True,
                       capture_output=True)

    def imagefs_use(self) -> int:
        """The image filesystem's use in percent as the kubelet's image GC computes it
        (pkg/kubelet/images/image_gc_manager.go, GarbageCollect: 100 - available*100/capacity)."""
        stats = os.statvfs(self.imagefs)
        capacity, available = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
        return 100 - available * 100 // capacity

    def fill_imagefs(self, percent: int) -> Path:
        """A file taking the image filesystem to `percent` used, as other images and logs would."""
        stats = os.statvfs(self.imagefs)
        capacity, available = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
        filler = self.imagefs / "filler"
        size = capacity * percent // 100 - (capacity - available) + (filler.stat().st_size if filler.exists() else 0)
        filler.unlink(missing_ok=True)
        subprocess.run(["fallocate", "-l", str(max(size, 0)), str(filler)], check=True, capture_output=True)
        return filler

    def _start_containerd(self) -> None:
        assert self.network is not None
        hosts = self.dir / "certs.d"
        # Every registry host, the default one too, is the stub: nothing is pulled from outside.
        write_hosts_toml(hosts, "_default", f"http://127.0.0.1:{self.registry_port}", skip_verify=True)
        cni_conf = self.dir / "cni"
        cni_conf.mkdir()
        (cni_conf / "10-node.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "node", "plugins": [
                # The bridge is the Pods' gateway: their Services are routed through the node.
                {"type": "bridge", "bridge": "ipfbr0", "isGateway": True, "ipMasq": False,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": netns.POD_SUBNET}]],
                          "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": str(self.dir / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))
        config = self.dir / "containerd.toml"
        config.write_text(_CONTAINERD_CONFIG.format(
            root=self.imagefs / "containerd", state=self.dir / "state", socket=self.socket, pause=PAUSE_NAME,
            hosts=hosts, cni_bin=CNI_BIN, cni_conf=cni_conf, runc=shutil.which("runc")))
        env_path = f"{self.containerd_bin.parent}:{os.environ.get('PATH', '')}"
        self.containerd = Process("containerd", self.network.enter(
            ["env", f"PATH={env_path}", str(self.containerd_bin), "--config", str(config)]),
            self.dir / "containerd.log")
        self.containerd.start()
        wait_for(lambda: self._ctr_ok("version"), "containerd answers", timeout_s=30)

    def _start_kubelet(self) -> None:
        assert self.network is not None
        plane = self.plane
        self.relay = TcpRelay((netns.HOST_ADDRESS, 0), ("127.0.0.1", plane.port))
        client_crt, client_key = plane.ca.issue(f"kubelet-{self.name}", f"system:node:{self.name}",
                                                org="system:nodes")
        serving_crt, serving_key = plane.ca.issue(f"kubelet-serving-{self.name}", self.name,
                                                  server_names=(self.address, self.name))
        kubeconfig = kubeconfig_document(
            f"https://{netns.HOST_ADDRESS}:{self.relay.address[1]}", plane.ca.cert_path,
            {"client-certificate-data": base64.b64encode(client_crt.read_bytes()).decode(),
             "client-key-data": base64.b64encode(client_key.read_bytes()).decode()})
        kubeconfig["clusters"][0]["cluster"]["tls-server-name"] = "localhost"  # the apiserver's SAN
        write_kubeconfig(self.dir / "kubelet.kubeconfig", kubeconfig)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # These VMs mount cgroup v1; kubelets since 1.35 refuse it unless told.
            "failCgroupV1": False, "cgroupDriver": "cgroupfs",
            "address": self.address, "port": KUBELET_PORT, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "tlsCertFile": str(serving_crt), "tlsPrivateKeyFile": str(serving_key),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(plane.ca.cert_path)}},
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": self.endpoint, "imageServiceEndpoint": self.endpoint,
            "podLogsDir": str(self.dir / "pod-logs"),
            "resolvConf": "", "failSwapOn": False, "protectKernelDefaults": False,
            "serializeImagePulls": False,
            # The host's disk is shared with everything else: only the tests' own GC settings evict.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "shutdownGracePeriod": "0s",
            **({"nodeStatusMaxImages": self.max_images} if self.max_images is not None else {}),
            **self.extra_config,
        }
        (self.dir / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self._run_kubelet()
        # The apiserver reaches the kubelet through its cluster egress, as it reaches the webhook.
        plane.network.expose(f"{self.address}:{KUBELET_PORT}", KUBELET_PORT, host=self.address)
        self._wait_ready()

    def _start_service_network(self) -> None:
        assert self.network is not None and self.relay is not None
        plane = self.plane
        discovery = k8s.DiscoveryV1Api(plane.api_client())
        discovery.create_namespaced_endpoint_slice("default", {
            "metadata": {"name": "kubernetes", "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "real-node.image-preflight.io"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [netns.HOST_ADDRESS], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.relay.address[1], "protocol": "TCP"}]})
        crt, key = plane.ca.issue("kube-proxy", "system:kube-proxy")  # bound to system:node-proxier
        kubeconfig = kubeconfig_document(
            f"https://{netns.HOST_ADDRESS}:{self.relay.address[1]}", plane.ca.cert_path,
            {"client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
             "client-key-data": base64.b64encode(key.read_bytes()).decode()})
        kubeconfig["clusters"][0]["cluster"]["tls-server-name"] = "localhost"
        write_kubeconfig(self.dir / "kube-proxy.kubeconfig", kubeconfig)
        (self.dir / "kube-proxy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.dir / "kube-proxy.kubeconfig")},
            "hostnameOverride": self.name, "mode": "iptables", "clusterCIDR": netns.POD_SUBNET,
            # Zero leaves the host-wide conntrack sysctls alone; the node's own are per namespace.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False},
            "metricsBindAddress": "127.0.0.1:10249", "healthzBindAddress": "127.0.0.1:10256",
        }))
        self.kube_proxy = Process("kube-proxy", self.network.enter([
            shutil.which("kube-proxy") or "kube-proxy", f"--config={self.dir / 'kube-proxy.yaml'}", "-v=2"]),
            self.dir / "kube-proxy.log")
        self.kube_proxy.start()
        for subnet in (SERVICE_CIDR, netns.POD_SUBNET):
            self.network.route_from_host(subnet)
            plane.network.route(subnet)
        wait_for(lambda: (self.kube_proxy.check_alive(), "KUBE-SVC-" in self._nat_rules())[1],
                 "kube-proxy programs the kubernetes Service", timeout_s=60, interval_s=0.5)

    def _nat_rules(self) -> str:
        assert self.network is not None
        return subprocess.run(self.network.enter(["iptables-save", "-t", "nat"]), capture_output=True,
                              text=True, check=False).stdout

    def restart_kubelet(self, **config) -> None:
        """The kubelet stopped and started again with these KubeletConfiguration fields changed
        (None removes one, so the kubelet's default applies); its Pods and images stay."""
        assert self.kubelet is not None
        self.kubelet.stop()
        path = self.dir / "kubelet.yaml"
        current = yaml.safe_load(path.read_text())
        for key, value in config.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        path.write_text(yaml.safe_dump(current))
        self._run_kubelet()
        self._wait_ready()
        wait_for(lambda: self.configz().get("nodeStatusMaxImages") == current.get("nodeStatusMaxImages", 50),
                 "the restarted kubelet's configz", timeout_s=30, interval_s=0.5)

    def configz(self) -> dict:
        """The kubelet's configz, read through the apiserver's node proxy as a user reads it."""
        done = self.plane.kubectl("get", "--raw", f"/api/v1/nodes/{self.name}/proxy/configz", check=False)
        return json.loads(done.stdout)["kubeletconfig"] if done.returncode == 0 else {}

    def _run_kubelet(self) -> None:
        assert self.network is not None
        self.kubelet = Process("kubelet", self.network.enter([
            shutil.which("kubelet") or "kubelet", f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}", f"--root-dir={self.dir / 'kubelet'}",
            f"--cert-dir={self.dir / 'kubelet-pki'}", f"--hostname-override={self.name}",
            f"--node-ip={self.address}", "-v=2"]), self.dir / "kubelet.log")
        self.kubelet.start()

    def _wait_ready(self) -> None:
        assert self.kubelet is not None
        kubelet = self.kubelet
        wait_for(lambda: (kubelet.check_alive(), self.ready())[1], f"node {self.name} is Ready",
                 timeout_s=READY_DEADLINE_S, interval_s=0.2)

    def ready(self) -> bool:
        try:
            node = self.plane.core().read_node(self.name, _request_timeout=5)
        except Exception:
            return False
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())

    # --- images ------------------------------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([str(self.containerd_bin.parent / "ctr"), "-a", str(self.socket), "-n", NAMESPACE,
                               *args], capture_output=True, text=True, check=False, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args[:4])} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def _ctr_ok(self, *args: str) -> bool:
        assert self.containerd is not None
        self.containerd.check_alive()
        return subprocess.run([str(self.containerd_bin.parent / "ctr"), "-a", str(self.socket), *args],
                              capture_output=True, check=False).returncode == 0

    def import_images(self, names: Sequence[str], *, pause: bool = False) -> None:
        """Imports the images as `ctr -n k8s.io images import` of a locally built archive leaves them."""
        archive = self.dir / f"images-{time.monotonic_ns()}.tar"
        write_images(archive, names, pause=pause)
        try:
            self.ctr("images", "import", str(archive))
        finally:
            archive.unlink()

    def remove_images(self, *names: str) -> None:
        """As image GC does (CRI RemoveImage by id): every reference of the image goes, its
        `sha256:<id>` one too, which containerd 2.x's CRI plugin adds on import and keeps
        listing, without names, when only the name is removed."""
        with ImageClient(self.endpoint) as cri:
            ids = {image.id for image in cri.list_images() if set(image.repo_tags) & set(names)}
        self.ctr("images", "rm", *names, *ids)

    def image_names(self) -> set[str]:
        return {row.strip() for row in self.ctr("images", "ls", "-q").splitlines() if row.strip()}

    def status_names(self) -> list[list[str]]:
        """The image names the kubelet posted in node status, image by image, in its order."""
        node = self.plane.core().read_node(self.name)
        return [list(image.names or ()) for image in node.status.images or ()]

    def wait_in_status(self, name: str, present: bool = True, timeout_s: float = 90.0) -> float:
        """Seconds until the kubelet's node status lists `name` (or no longer does)."""
        start = time.monotonic()
        wait_for(lambda: any(name in names for names in self.status_names()) == present,
                 f"{name} {'in' if present else 'gone from'} {self.name}'s status", timeout_s=timeout_s,
                 interval_s=0.25)
        return time.monotonic() - start

    # --- what containerd asked for ------------------------------------------------------------------

    def registry_requests(self) -> list[str]:
        return self.registry_log.read_text().splitlines() if self.registry_log.exists() else []

    def outside_requests(self) -> list[str]:
        """containerd's log lines that resolved or dialled anything but the stub registry."""
        log = self.dir / "containerd.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return outside_requests(text, f"127.0.0.1:{self.registry_port}", *self.trusted)

    def trust_registry(self, host: str, ca: Path) -> None:
        """Pull from the registry at `host` (host:port, on the host side of the veth) over TLS of
        `ca`, as a node configured for a cluster's own registry does (containerd's
        certs.d/<host>/hosts.toml; read at each pull, so no restart). Every other host stays the stub."""
        write_hosts_toml(self.dir / "certs.d", host, f"https://{host}", ca=ca)
        self.trusted.append(host)

    # --- teardown parts ------------------------------------------------------------------------------

    def _remove_pods(self) -> None:
        core = self.plane.core()
        selector = f"spec.nodeName={self.name}"
        for pod in core.list_pod_for_all_namespaces(field_selector=selector).items:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        if self.kubelet is not None and self.kubelet.popen is not None and self.kubelet.popen.poll() is None:
            # The kubelet stops the sandboxes of deleted Pods, which tears down their network;
            # stopped tasks stay listed until the kubelet's container GC. What it has not stopped
            # in time _kill_tasks kills, and leftovers() proves gone: only a leak fails the run.
            deadline = time.monotonic() + 30
            while self.running_tasks() and time.monotonic() < deadline:
                time.sleep(0.5)

    def running_tasks(self) -> list[str]:
        rows = [row.split() for row in self.ctr("tasks", "ls").splitlines()[1:]]
        return [row[0] for row in rows if len(row) >= 3 and row[2] != "STOPPED"]

    def _kill_tasks(self) -> None:
        if self.containerd is None or self.containerd.popen is None or self.containerd.popen.poll() is not None:
            return
        for task in self.ctr("tasks", "ls", "-q").split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            self.ctr("tasks", "delete", "-f", task, check=False)
        for container in self.ctr("containers", "ls", "-q").split():
            self.ctr("containers", "rm", container, check=False)

    def _kill_leftovers(self) -> None:
        for line in _processes_mentioning(str(self.dir)):
            pid = int(line.split()[0])
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not _processes_mentioning(str(self.dir)), "the node's processes ended", timeout_s=15)

    def _unmount(self) -> None:
        for point in sorted(mounts_under([str(self.dir)]), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        # The loop device goes once its filesystem is released (mount -o loop sets autoclear).
        wait_for(lambda: not _loop_devices(self._imagefs_file), "the image filesystem's loop device is released",
                 timeout_s=15, interval_s=0.2)

    def _restore_sysctls(self) -> None:
        for name, value in self._sysctls.items():
            (Path("/proc/sys") / name).write_text(value)

    def _remove_host_folders(self) -> None:
        if CONTAINER_LOG_LINKS.exists():
            pod_logs = str(self.dir / "pod-logs")
            for link in CONTAINER_LOG_LINKS.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(pod_logs):
                    link.unlink()
        for path, had in self._had.items():
            if had or not path.exists():
                continue
            if path == RUN_CONTAINERD:
                shutil.rmtree(path)  # only the shims' socket folders, all of them ours
            elif not any(path.iterdir()) or path == AGL_LOGS:
                shutil.rmtree(path)


def _loop_devices(backing: Path) -> list[str]:
    done = subprocess.run(["losetup", "-j", str(backing)], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()


class TeardownError(Exception):
    """What the real node left behind or reached, found when it stopped."""


def _teardown(node: RealNode) -> list[str]:
    problems = node.stop()
    outside = node.outside_requests()
    if outside:
        problems.append("containerd reached beyond the stub registry:\n  " + "\n  ".join(outside[:10]))
    return problems


@contextlib.contextmanager
def running_real_node(folder: Path) -> Iterator[RealNode]:
    """A real node registered with a control plane of its own in `folder` (so that no other test's
    Pods land on it, and its Pods on no other test's nodes), as the cluster's only node. Leaving
    stops it whatever happened inside; TeardownError when that found anything left or reached."""
    require_real_node()
    with running_control_plane(folder) as plane:
        node = RealNode(plane)
        try:
            node.start()
        except BaseException:
            node.stop()
            raise
        try:
            yield node
        finally:
            problems = _teardown(node)
        if problems:
            raise TeardownError("real node teardown: " + "; ".join(problems))
