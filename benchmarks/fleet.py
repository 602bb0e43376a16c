"""A fleet on KWOK: what a published form of the node agents' image lists costs etcd, the
apiserver and the webhook. --form today (the default): one NodeImages object per node, the whole
runtime list in it, renewed by rewriting it; --form hashes: the same object with its names' hashes
(the agent's --list-form hashes) in place of the list.

    export PATH="$(tests/controlplane/build | tail -n 1):$PATH"
    benchmarks/fleet/build                               # kwok, cached; found by this script too
    .venv/bin/python benchmarks/fleet.py                 # --nodes 200 --images 5000 [--form today]
                                                         # [--digests] [--pods-per-node N] [--json FILE]
    .venv/bin/python benchmarks/fleet.py --quick         # 300 nodes, 20 s idle

1. The tests' control plane (tests/controlplane/cluster.py) and the chart's ServiceAccounts, roles
   and NodeImages CRD. KWOK (sigs.k8s.io/kwok, benchmarks/fleet/build) keeps --nodes fake Nodes
   Ready out of cluster: its node-initialize stage writes their status, its lease controller
   renews their Leases every 10 s (--node-lease-duration-seconds=40), as kubelets would; with
   --pods-per-node, the scheduler places that many Pods per node and kwok's pod stages run them.
   Without kwok (--no-kwok, or no Go to build it) the nodes are created as the tests create them
   and the control plane's own heartbeat renews their Leases.
2. Each node's image set drawn like a SWE-smith fleet: a catalogue of --catalogue locally built
   images (`docker.io/swebench/sweb.eval.x86_64.<owner>_1776_<repo>-<n>:openai`, a tag and no
   repo digest unless --digests), image i held by each node with probability min(1, (c/i)^s)
   (--zipf s; c such that a node holds --images on average), trimmed or filled to exactly
   --images: a core that every node holds, a tail that few do. A local build is not reproducible,
   so each node's copy has an image ID of its own (a pulled one, with --digests, the same on every
   node). Plus the sandbox image, pulled and pinned.
3. Round 1: every node's list written in the --form, --workers agents at a time; today's through
   the agent's own Publisher (agent/publisher.py: image_dicts, fingerprint, node_images_object,
   the create). Round 2: the renewal an idle agent makes (today: publish_reason RENEW, only
   spec.observedAt changes; hashes: its Lease), through the same Publisher objects, so nothing is
   read again. Before and after each round: etcd's
   database size and size in use (its /metrics), the bytes the apiserver received
   (apiserver_request_body_size_bytes), kube-apiserver's and etcd's RSS. etcd compacted, as the
   apiserver's compactor does every 5 minutes (turned off here), before round 1 and after round
   2: their difference is the live objects, what round 2 added before it the history a rewrite
   leaves. Beside them, what the fleet writes anyway over --idle seconds before round 1 (kwok's
   Lease renewals): the baseline KEP-589 left node heartbeats at.
4. `image-preflight serve` as the chart runs it (its ServiceAccount's token, --max-images 50, the
   chart's webhook configuration; benchmarks/fleet_faces.py): the time from its start to /readyz
   200 (the Nodes and the NodeImages listed) and to holding every name written (its inventory
   gauges), its RSS, two decisions to show it holds the lists, and a list changed on one node
   timed to the decision that needs it. The webhook's call as the apiserver's tracing spans time
   it (--spans seconds of Jobs, dryRun): on the fleet, and on its first 3 nodes before the rest
   exist (their lists then deleted, so that round 1 writes every list as on a new cluster). In
   both phases every third Job goes to a reference serve deciding from a file of those 3 nodes'
   lists (fleet_faces.Reference): the same call on 3 nodes at the same moments, the baseline that
   the fleet's load on this machine (its control plane, kwok) slows as much as the webhook's.
5. `inventory dump`, `doctor` and `scan` (of a 6,343-row dataset, from the cluster and from the
   dump) against the whole fleet, each as a process: wall time, CPU, peak RSS.

Every figure printed is measured in this run; the differences section only subtracts rows, and
its per-second rates divide a measured request by the agent's renewal period. Bounded: each wait
has a deadline, a round stops when it passes --round-deadline or kube-apiserver's RSS passes
--max-apiserver-gib (the rest of the run then reports what it has). Everything listens on
127.0.0.1 and is stopped and removed at the end. Prints a table; --json FILE writes the figures.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from kubernetes import client as k8s

from benchmarks.figures import hwm_mib, percentile, rss_mib, tree_cpu_seconds
from benchmarks.fleet_faces import JUDGED_NAMESPACE, Reference, Webhook, job_spans, timed_command
from image_preflight.agent.cri import RuntimeImage
from image_preflight.agent.inventory import fingerprint, image_dicts, sandbox_image_report
from image_preflight.agent.publisher import Publisher
from image_preflight.core.sources.runtime_lists import (
    AGENT_NAMESPACE,
    GROUP,
    LEASE_GROUP,
    LEASE_PLURAL,
    LEASE_VERSION,
    PLURAL,
    RENEW_WHEN_REMAINING,
    VERSION,
    image_hashes,
    lease_object,
    runtime_object,
)
from tests.controlplane.cluster import (
    NOT_READY,
    ControlPlane,
    Process,
    apply_service_accounts,
    create_node,
    require_control_plane,
    wait_for,
)
from tests.controlplane.tracing import WEBHOOK_SPAN, SpanReceiver
from tests.controlplane.webhook import ServedWebhook
from tests.serving import ServiceConnection, client_context

ROOT = Path(__file__).resolve().parents[1]
FLEET_BUILD = ROOT / "benchmarks" / "fleet" / "build"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
FLEET_LABEL = "image-preflight.bench/fleet"
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.1"
LEASE_S = 300  # the agent's --lease default (agent/config.py): the renewal period rates are given at
KWOK_LEASE_S = 40  # the kubelet's nodeLeaseDurationSeconds; kwok renews every quarter of it
NODE_MONITOR_GRACE_S = 50  # kube-controller-manager's --node-monitor-grace-period default
PODS_NAMESPACE = "fleet"
NODES_READY_DEADLINE_S = 120.0
SERVE_READY_DEADLINE_S = 600.0
# SWE-bench's and SWE-Gym's repositories (owner, repo), as SWE-bench names its images.
REPOS = [
    ("astropy", "astropy"), ("django", "django"), ("matplotlib", "matplotlib"), ("mwaskom", "seaborn"),
    ("pallets", "flask"), ("psf", "requests"), ("pydata", "xarray"), ("pylint-dev", "pylint"),
    ("pytest-dev", "pytest"), ("scikit-learn", "scikit-learn"), ("sphinx-doc", "sphinx"), ("sympy", "sympy"),
    ("getmoto", "moto"), ("python", "mypy"), ("pandas-dev", "pandas"), ("iterative", "dvc"), ("dask", "dask"),
    ("conan-io", "conan"), ("pydantic", "pydantic"), ("facebookresearch", "hydra"), ("bokeh", "bokeh"),
    ("modin-project", "modin"), ("project-monai", "monai"), ("marshmallow-code", "marshmallow"),
]


# --- the fleet's images ---------------------------------------------------------------------------

def catalogue(count: int, *, digests: bool, rng: np.random.Generator) -> list[RuntimeImage]:
    """`count` locally built images as the runtime lists them: an image ID, one tag, a size of
    1-4 GB; with `digests` a repo digest too (what a pull or a push leaves)."""
    images, seen = [], set()
    while len(images) < count:
        owner, repo = REPOS[int(rng.integers(len(REPOS)))]
        number = int(rng.integers(100, 40_000))
        name = f"docker.io/swebench/sweb.eval.x86_64.{owner}_1776_{repo}-{number}"
        if name in seen:
            continue
        seen.add(name)
        image_id = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
        repo_digests = (f"{name}@sha256:{hashlib.sha256(b'manifest ' + name.encode()).hexdigest()}",) if digests else ()
        images.append(RuntimeImage(id=image_id, repo_tags=(f"{name}:openai",), repo_digests=repo_digests,
                                   size=int(rng.integers(1_000_000_000, 4_000_000_000)), pinned=False))
    return images


def holding_probabilities(count: int, per_node: int, exponent: float) -> np.ndarray:
    """min(1, (c / rank)^exponent), c chosen so that the probabilities sum to `per_node`."""
    rank = np.arange(1, count + 1, dtype=float)
    low, high = 1e-9, float(count)
    for _ in range(200):
        c = (low + high) / 2
        if np.minimum(1.0, (c / rank) ** exponent).sum() < per_node:
            low = c
        else:
            high = c
    return np.minimum(1.0, (high / rank) ** exponent)


def draw_sets(nodes: int, per_node: int, probabilities: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Each node's catalogue indices: each image held with its probability, then trimmed at
    random or filled by probability to exactly `per_node`. An image of probability 1 (a fleet's
    base images) is never trimmed while others can be: it is on every node."""
    certain = probabilities >= 1.0
    sets = []
    for _ in range(nodes):
        held = rng.random(probabilities.size) < probabilities
        chosen = np.flatnonzero(held)
        if chosen.size > per_node:
            kept, others = np.flatnonzero(certain & held), np.flatnonzero(~certain & held)
            if kept.size >= per_node:
                chosen = rng.choice(kept, per_node, replace=False)
            else:
                chosen = np.concatenate([kept, rng.choice(others, per_node - kept.size, replace=False)])
        elif chosen.size < per_node:
            rest = np.flatnonzero(~held)
            weights = probabilities[rest] / probabilities[rest].sum()
            chosen = np.concatenate([chosen, rng.choice(rest, per_node - chosen.size, replace=False, p=weights)])
        sets.append(np.sort(chosen).astype(np.int32))
    return sets


def node_list(images: list[RuntimeImage], chosen: np.ndarray, node: str) -> list[dict]:
    """A node's image dicts as its agent publishes them, the sandbox image last in `images` with
    them. A pulled image (one with a repo digest) has the same ID on every node; a local build is
    not reproducible, so each node's has an ID of its own."""
    def on_node(image: RuntimeImage) -> RuntimeImage:
        if image.repo_digests:
            return image
        return RuntimeImage(id="sha256:" + hashlib.sha256(f"{node}/{image.id}".encode()).hexdigest(),
                            repo_tags=image.repo_tags, repo_digests=(), size=image.size, pinned=image.pinned)
    return image_dicts([*(on_node(images[i]) for i in chosen), images[-1]])


def sharing(sets: list[np.ndarray], count: int) -> dict:
    """How much of the fleet's (node, image) pairs are images many nodes share."""
    holders = np.zeros(count, dtype=np.int64)
    for chosen in sets:
        holders[chosen] += 1
    share, pairs = holders / len(sets), holders.sum()
    return {
        "distinct_images": int((holders > 0).sum()),
        "images_on_every_node": int((holders == len(sets)).sum()),
        "images_on_at_most_5pct": int(((holders > 0) & (share <= 0.05)).sum()),
        "pairs_on_90pct_or_more": float(holders[share >= 0.9].sum() / pairs),
        "pairs_on_half_or_more": float(holders[share >= 0.5].sum() / pairs),
        "pairs": int(pairs),
    }


# --- the control plane, kwok and what they report --------------------------------------------------

class FleetControlPlane(ControlPlane):
    """The tests' control plane. With kwok keeping the nodes its own Lease heartbeat stays off:
    it would make itself their Leases' holder, and kwok then leaves those nodes alone. The
    apiserver's own compaction (every 5 minutes) is off too: etcd is compacted where the table
    says, so that no row's difference holds a compaction that happened to fall inside it. The
    controller-manager and the scheduler may send 100 requests a second, as kwokctl runs them for
    large fake clusters (its disableQPSLimits) and Kubernetes' 5,000-node scalability tests run
    the controller-manager: at client-go's default of 20, tainting and untainting thousands of new
    nodes takes most of the run. The node lifecycle controller waits five renewal periods of the
    nodes' Leases before it calls a node NotReady (its default 50 s against a kubelet's 10 s):
    with a longer --kwok-lease, at the default it would taint nodes that are renewing on time,
    and every such taint is a Node change that the webhook's placements read."""

    def __init__(self, folder: Path, *, lease_heartbeat: bool, node_lease_s: int = KWOK_LEASE_S,
                 tracing_endpoint: str | None = None) -> None:
        self.lease_heartbeat = lease_heartbeat
        super().__init__(folder, tracing_endpoint=tracing_endpoint)
        self.apiserver.args.append("--etcd-compaction-interval=0")
        for process in (self.controller_manager, self.scheduler):
            process.args.extend(["--kube-api-qps=100", "--kube-api-burst=200"])
        grace_s = max(NODE_MONITOR_GRACE_S, 5 * node_lease_s // 4)
        self.controller_manager.args.append(f"--node-monitor-grace-period={grace_s}s")

    def _heartbeat_loop(self) -> None:
        if self.lease_heartbeat:
            super()._heartbeat_loop()


def kwok_folder() -> tuple[Path | None, str]:
    """benchmarks/fleet/build's folder (built or reused), or None and why not."""
    if shutil.which("go") is None:
        return None, "no Go toolchain on PATH to build kwok"
    done = subprocess.run([str(FLEET_BUILD)], capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        return None, f"benchmarks/fleet/build failed: {done.stderr.strip().splitlines()[-1:]}"
    return Path(done.stdout.strip().splitlines()[-1]), ""


def start_kwok(plane: ControlPlane, folder: Path, work: Path, lease_s: int = KWOK_LEASE_S) -> Process:
    kwok = Process("kwok", [
        str(folder / "kwok"), f"--kubeconfig={plane.kubeconfig}", f"--config={folder / 'stages.yaml'}",
        "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        "--manage-nodes-with-label-selector=", "--manage-single-node=",
        f"--node-lease-duration-seconds={lease_s}",
        # Pod and node IPs from ranges of their own, apart from the Service range (10.0.0.0/24).
        "--cidr=10.64.0.0/12", "--node-ip=10.63.0.1",
    ], work / "kwok.log")
    # kwok also reads ~/.kwok/kwok.yaml when it exists: a HOME of its own keeps it to --config.
    kwok.start(env={**os.environ, "HOME": str(work)})
    return kwok


def etcd_sizes(plane: ControlPlane) -> dict:
    import urllib.request

    with urllib.request.urlopen(plane.etcd_url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    wanted = {"etcd_mvcc_db_total_size_in_bytes": "db", "etcd_mvcc_db_total_size_in_use_in_bytes": "in_use",
              "etcd_server_quota_backend_bytes": "quota"}
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            found[wanted[name]] = int(float(value))
    return found


def compact(plane: ControlPlane) -> None:
    """Compact etcd at its current revision, unless it is already compacted there (nothing was
    written since)."""
    import urllib.error

    try:
        plane.compact_etcd()
    except urllib.error.HTTPError as exc:
        if "compacted" not in exc.read().decode(errors="replace"):
            raise
    time.sleep(2.0)  # etcd frees the pages of the compacted revisions in batches


def etcd_value_bytes(plane: ControlPlane, key: str) -> int | None:
    """The size of the value etcd stores under `key` (the apiserver's /registry/...)."""
    import base64
    import urllib.request

    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    request = urllib.request.Request(plane.etcd_url + "/v3/kv/range", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        kvs = json.load(answer).get("kvs") or []
    return len(base64.b64decode(kvs[0]["value"])) if kvs else None


def request_bytes(plane: ControlPlane) -> dict[tuple[str, str], tuple[float, float]]:
    """apiserver_request_body_size_bytes: (resource, verb) -> (bytes received, requests)."""
    text = plane.kubectl("get", "--raw", "/metrics").stdout
    sums: dict[tuple[str, str], list[float]] = {}
    for line in text.splitlines():
        for suffix, slot in (("_sum{", 0), ("_count{", 1)):
            prefix = "apiserver_request_body_size_bytes" + suffix
            if line.startswith(prefix):
                labels, value = line[len(prefix):].rsplit("} ", 1)
                parts = dict(part.split("=", 1) for part in labels.split(","))
                key = (parts["resource"].strip('"'), parts["verb"].strip('"'))
                sums.setdefault(key, [0.0, 0.0])[slot] += float(value)
    return {key: (value[0], value[1]) for key, value in sums.items()}


WRITES = ("create", "update", "patch")


def received(after: dict, before: dict, resources: tuple[str, ...], verbs: tuple[str, ...]) -> tuple[float, int]:
    """Request body bytes and requests the apiserver received between two request_bytes()."""
    total, count = 0.0, 0.0
    for resource, verb in ((resource, verb) for resource in resources for verb in verbs):
        a, b = after.get((resource, verb), (0.0, 0.0)), before.get((resource, verb), (0.0, 0.0))
        total += a[0] - b[0]
        count += a[1] - b[1]
    return total, int(count)


class Watch:
    """kube-apiserver's RSS sampled every 0.25 s: its peak, and an abort flag past the limit."""

    def __init__(self, plane: ControlPlane, limit_gib: float) -> None:
        self.pid = plane.apiserver.popen.pid  # type: ignore[union-attr]  # started: popen is set
        self.limit_mib = limit_gib * 1024
        self.peak_mib = 0.0
        self.over = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                rss = rss_mib(self.pid)
            except (OSError, RuntimeError):
                return
            self.peak_mib = max(self.peak_mib, rss)
            if rss > self.limit_mib:
                self.over.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# --- the fleet -------------------------------------------------------------------------------------

def node_name(index: int) -> str:
    return f"fleet-{index:05d}"


def create_nodes(plane: ControlPlane, indices: range, *, kwok: bool, workers: int) -> None:
    core = plane.core()

    def create(index: int) -> None:
        name = node_name(index)
        labels = {FLEET_LABEL: "true", "kubernetes.io/arch": "amd64", "type": "cpu"}
        if not kwok:  # as the tests create them: status posted once, the Lease renewed by the heartbeat
            create_node(plane, name, labels=labels, taints=[], wait_ready=False)
            return
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}}, "spec": {}},
            _request_timeout=30)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, indices))


def create_pods(plane: ControlPlane, count: int, image: str, *, workers: int) -> None:
    """`count` Pods for the scheduler to place on the fleet's nodes, for kwok to run."""
    core = plane.core()
    core.create_namespace({"metadata": {"name": PODS_NAMESPACE}}, _request_timeout=30)
    # Admission refuses Pods until the controller-manager has made the namespace's default ServiceAccount.
    wait_for(lambda: core.list_namespaced_service_account(PODS_NAMESPACE, _request_timeout=10).items,
             f"the default ServiceAccount of namespace {PODS_NAMESPACE}", timeout_s=60)

    def create(index: int) -> None:
        core.create_namespaced_pod(PODS_NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"rollout-{index:06d}", "labels": {FLEET_LABEL: "true"}}, "spec": {
            "nodeSelector": {FLEET_LABEL: "true"},
            "containers": [{"name": "rollout", "image": image, "imagePullPolicy": "IfNotPresent"}]}},
            _request_timeout=30)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, range(count)))


def wait_count(counted: Callable[[], int], count: int, what: str, deadline_s: float, alive: list[Process],
               interval_s: float = 1.0) -> float:
    """Seconds until `counted()` reaches `count`, checking that each of `alive` still runs."""
    start = time.monotonic()
    while (found := counted()) < count:
        for process in alive:
            process.check_alive()
        if time.monotonic() - start > deadline_s:
            raise RuntimeError(f"{found} of {count} {what} after {deadline_s:.0f} s")
        time.sleep(interval_s)
    return time.monotonic() - start


def running_pods(plane: ControlPlane) -> int:
    return len(plane.core().list_namespaced_pod(PODS_NAMESPACE, field_selector="status.phase=Running",
                                                _request_timeout=60).items)


def ready_nodes(plane: ControlPlane) -> int:
    ready = 0
    for node in plane.core().list_node(label_selector=f"{FLEET_LABEL}=true", _request_timeout=60).items:
        conditions = {c.type: c.status for c in node.status.conditions or ()}
        if conditions.get("Ready") == "True" and not any(t.key == NOT_READY for t in node.spec.taints or ()):
            ready += 1
    return ready


def wait_ready(plane: ControlPlane, count: int, deadline_s: float, alive: list[Process]) -> float:
    return wait_count(lambda: ready_nodes(plane), count, "nodes Ready", deadline_s, alive)


# --- what the agents write (--form) ----------------------------------------------------------------

def etcd_key(prefix: str, name: str, namespace: str = "") -> str:
    """Where the apiserver keeps an object in etcd, under its resource's prefix."""
    return f"{prefix}/{namespace + '/' if namespace else ''}{name}"


class PublisherForm:
    """today, hashes: each node's agent's own Publisher (agent/publisher.py) as it is. today: one
    NodeImages object holding the whole list, renewed by rewriting it (only spec.observedAt
    changes). hashes (--list-form hashes): the names' hashes in its place, renewed through the
    node's Lease in the agents' namespace (agent/renewal.py). Each node's Publisher is kept across
    rounds, so a renewal reads nothing first."""

    resources = (PLURAL,)

    def __init__(self, plane: ControlPlane, api: k8s.ApiClient, nodes: int, *, hashed: bool = False,
                 lease_s: int = LEASE_S) -> None:
        self.name = "hashes" if hashed else "today"
        self._api, self._hashed, self.lease_s = api, hashed, lease_s
        self.publishers = [Publisher(api, node_name(i), lease_seconds=lease_s, hashed=hashed) for i in range(nodes)]
        # The apiserver counts request bytes by resource, not namespace: kwok's node Leases would
        # drown the agents' renewals, so these are counted as the client sends them.
        self.sent = SentLeases(api) if hashed else None

    def write(self, index: int, images: list[dict], spec: dict, now: float) -> str | None:
        return self.publishers[index].publish(images, now=now, digest=fingerprint(images), spec=spec)

    # What an idle agent's cycle does: the same list again, published if due.
    renew = write

    def forget(self, index: int) -> None:
        """Delete what node `index`'s agent wrote and start it afresh, as on a new node."""
        objects = k8s.CustomObjectsApi(self._api)
        objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, node_name(index), _request_timeout=30)
        if self.publishers[index].renewal and self.publishers[index].renewal.renewed_at is not None:
            objects.delete_namespaced_custom_object(LEASE_GROUP, LEASE_VERSION, AGENT_NAMESPACE, LEASE_PLURAL,
                                                    node_name(index), _request_timeout=30)
        self.publishers[index] = Publisher(self._api, node_name(index), lease_seconds=self.lease_s,
                                           hashed=self._hashed)

    def stored(self, index: int) -> list[tuple[str, dict]]:
        publisher = self.publishers[index]
        stored = [] if publisher.stored is None else [
            (etcd_key(f"/registry/{GROUP}/{PLURAL}", node_name(index)), publisher.stored)]
        if publisher.renewal is not None and publisher.renewal.renewed_at is not None:
            lease = lease_object(node_name(index), AGENT_NAMESPACE, renewed_at=publisher.renewal.renewed_at,
                                 lease_seconds=self.lease_s)
            stored.append((etcd_key("/registry/leases", node_name(index), AGENT_NAMESPACE), lease))
        return stored


class SentLeases:
    """The bytes of the Lease writes an ApiClient sends (bodies as its REST client serialises them)."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.bytes, self.requests = 0, 0
        self._lock = threading.Lock()
        send = api.rest_client.request

        def counted(method, url, *args, **kwargs):
            body = kwargs.get("body")
            if method in ("POST", "PUT", "PATCH") and "/leases" in url and body is not None:
                with self._lock:
                    self.bytes += len(json.dumps(body))
                    self.requests += 1
            return send(method, url, *args, **kwargs)

        api.rest_client.request = counted

    def take(self) -> tuple[int, int]:
        """The bytes and requests since the last take."""
        with self._lock:
            taken, self.bytes, self.requests = (self.bytes, self.requests), 0, 0
        return taken


# --form: the published forms measured on the same fleet, each made as
# FORMS[name](plane, api_client, nodes, lease_s=...).
FORMS = {"today": PublisherForm, "hashes": functools.partial(PublisherForm, hashed=True)}


class Round:
    """One write (or renewal) of every node's objects, --workers at a time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.latencies: list[float] = []
        self.reasons: dict[str, int] = {}
        self.failures: list[str] = []
        self.written = 0
        self.stopped = ""
        self.wall_s = 0.0
        self.client_cpu_s = 0.0


def agent_listing(images: list[RuntimeImage], chosen: np.ndarray, index: int) -> tuple[list[dict], dict]:
    """What a node's agent cycle makes of the runtime's list before it publishes: the image dicts
    and the spec's sandbox report."""
    listed = node_list(images, chosen, node_name(index))
    return listed, {"sandboxImage": sandbox_image_report(SANDBOX_IMAGE, listed), "pinning": None}


def write_round(name: str, step, nodes: int, sets: list[np.ndarray], images: list[RuntimeImage],
                *, observed_at, workers: int, watch: Watch, deadline_s: float) -> Round:
    """`step(index, images, spec, now)` for every node: the form's write or renew."""
    done = Round(name)
    lock = threading.Lock()
    start, cpu = time.monotonic(), time.process_time()

    def publish(index: int) -> None:
        if watch.over.is_set() or time.monotonic() - start > deadline_s:
            return
        listed, spec = agent_listing(images, sets[index], index)
        began = time.monotonic()
        try:
            reason = step(index, listed, spec, observed_at())
        except Exception as exc:  # noqa: BLE001 - every failure is counted and its first words kept
            with lock:
                done.failures.append(f"{node_name(index)}: {str(exc).splitlines()[0][:300]}")
            return
        with lock:
            done.latencies.append(time.monotonic() - began)
            done.reasons[str(reason)] = done.reasons.get(str(reason), 0) + 1
            done.written += reason is not None

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(publish, range(nodes)))
    done.wall_s, done.client_cpu_s = time.monotonic() - start, time.process_time() - cpu
    if watch.over.is_set():
        done.stopped = f"kube-apiserver RSS passed {watch.limit_mib / 1024:g} GiB"
    elif done.wall_s > deadline_s:
        done.stopped = f"past the round's deadline of {deadline_s:.0f} s"
    return done


BEFORE_LISTS = "nodes Ready, etcd compacted: before the lists"
AFTER_ROUND_1 = "after round 1 (every node's list written)"
AFTER_ROUND_2 = "after round 2 (every node renewed once)"
AFTER_COMPACTION = "after compaction"


def snapshot(plane: ControlPlane, label: str, rows: list[dict]) -> dict:
    sizes = etcd_sizes(plane)
    row = {"when": label, "etcd_db": sizes.get("db"), "etcd_in_use": sizes.get("in_use"),
           "etcd_quota": sizes.get("quota"),
           "apiserver_rss_mib": rss_mib(plane.apiserver.popen.pid),  # type: ignore[union-attr]  # started: popen is set
           "etcd_rss_mib": rss_mib(plane.etcd.popen.pid)}  # type: ignore[union-attr]  # started: popen is set
    rows.append(row)
    return row


# --- serve -----------------------------------------------------------------------------------------

def https(port: int, ca: Path, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """A request as the apiserver makes it (tests/serving.py: the Service's name, the CA verified)."""
    connection = ServiceConnection(port, client_context(ca))
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def wait_lists_held(popen: subprocess.Popen, metrics_port: int, nodes: int, names: int, deadline_s: float) -> float:
    """Seconds until serve's inventory holds every node and every name written, as its gauges say:
    what /readyz promises, checked apart from it."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if popen.poll() is not None:
            raise RuntimeError(f"serve exited with {popen.returncode}")
        gauges = serve_gauges(metrics_port)
        if (gauges.get("image_preflight_inventory_nodes", 0) >= nodes
                and gauges.get("image_preflight_inventory_images", 0) >= names):
            return time.monotonic() - start
        time.sleep(0.1)
    raise RuntimeError(f"serve's inventory short of the {names:,} names written after {deadline_s:.0f} s: {gauges}")


def serve_gauges(metrics_port: int) -> dict:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        for name in ("image_preflight_inventory_nodes", "image_preflight_inventory_images"):
            if line.startswith(name + " "):
                found[name] = float(line.split()[1])
    return found


def decide(port: int, ca: Path, image: str, node: str | None = None) -> bool:
    """serve's answer for a rollout Job naming `image` (IfNotPresent, any node, or only `node`)."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "00000000-0000-4000-8000-000000000001",
        "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
        "namespace": "rl", "operation": "CREATE", "userInfo": {"username": "system:serviceaccount:rl:trainer"},
        "object": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "rollout", "namespace": "rl"},
                   "spec": {"template": {"spec": {
                       "restartPolicy": "Never",
                       "nodeSelector": {"kubernetes.io/hostname": node} if node else {},
                       "containers": [{"name": "rollout", "image": image, "imagePullPolicy": "IfNotPresent"}]}}}},
        "dryRun": False}}
    status, body = https(port, ca, "POST", "/validate?timeout=10s", json.dumps(review).encode())
    if status != 200:
        raise RuntimeError(f"/validate answered {status}")
    return bool(json.loads(body)["response"]["allowed"])


CHANGE_DEADLINE_S = 60.0
SETTLE_S = 2.0
BASELINE_NODES = 3  # the webhook's call is first timed on a cluster this small
SPAN_IMAGES = 50  # Jobs name these in turn: the images most nodes hold
SPAN_RATE = 20.0  # Jobs created a second while the webhook's call is timed


def change_to_decision(form, index: int, sets: list[np.ndarray], images: list[RuntimeImage], port: int,
                       ca: Path) -> float | None:
    """An image built on one node as its agent publishes it: seconds from the write to serve's
    first admission of a Job bound to that node (None: not within CHANGE_DEADLINE_S)."""
    node = node_name(index)
    built = RuntimeImage(id="sha256:" + hashlib.sha256(b"built on one node").hexdigest(),
                         repo_tags=("docker.io/swebench/sweb.eval.x86_64.fleet_1776_change-1:openai",),
                         repo_digests=(), size=1 << 30, pinned=False)
    if decide(port, ca, built.repo_tags[0], node):
        raise RuntimeError(f"a Job for {built.repo_tags[0]} on {node} was admitted before the image was built")
    listed, spec = agent_listing([*images[:-1], built, images[-1]], np.append(sets[index], len(images) - 1), index)
    start = time.monotonic()
    form.write(index, listed, spec, time.time())
    while time.monotonic() - start < CHANGE_DEADLINE_S:
        if decide(port, ca, built.repo_tags[0], node):
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def timed_calls(plane: ControlPlane, receiver: SpanReceiver, served: ServedWebhook, reference: Reference,
                form, images: list[RuntimeImage], sets: list[np.ndarray], names: list[str], *,
                seconds: float, label: str) -> dict:
    """job_spans of `served` beside a reference serve deciding from the first BASELINE_NODES
    nodes' lists, written for it now as their agents publish them."""
    items = []
    for index in range(min(BASELINE_NODES, len(sets))):
        listed, spec = agent_listing(images, sets[index], index)
        items.append(runtime_object(node_name(index), listed, observed_at=time.time(), lease_seconds=form.lease_s,
                                    sandbox_image=spec["sandboxImage"],
                                    hashes=image_hashes(listed) if form.name == "hashes" else None))
    snapshot = reference.work / f"reference-{label}.json"
    snapshot.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    served_reference = reference.serve(snapshot)
    served_reference.start(timeout_s=SERVE_READY_DEADLINE_S)
    try:
        return job_spans(plane, receiver, served, served_reference, names, seconds=seconds, rate=SPAN_RATE,
                         label=label)
    finally:
        served_reference.stop()


DATASET_ROWS = 6343  # the training set of the run in the README


def commands_at_size(plane: ControlPlane, work: Path, images: list[RuntimeImage], held: np.ndarray, port: int,
                     rng: np.random.Generator) -> dict:
    """What a user runs against the whole cluster, each as a process with the admin kubeconfig:
    `inventory dump`, `doctor` (reading serve's certificate at `port`), `scan` of a dataset whose
    rows name images one node holds, from the cluster and from the dump."""
    dataset = work / "rows.jsonl"
    with open(dataset, "w") as out:
        for row, index in enumerate(rng.choice(held, DATASET_ROWS)):
            out.write(json.dumps({"instance_id": f"row-{row}", "image_name": images[int(index)].repo_tags[0]}) + "\n")
    admin, dump = str(plane.kubeconfig), work / "dump.json"
    scan = ["scan", "--image", "{{ input.image_name }}", str(dataset), "--out-dir", str(work / "kept")]
    return {
        "inventory dump": timed_command(["inventory", "dump", "--kubeconfig", admin, "--out", str(dump)],
                                        work / "dump.log"),
        "doctor": timed_command(["doctor", "--kubeconfig", admin, "--namespace", JUDGED_NAMESPACE,
                                 "--webhook-address", f"127.0.0.1:{port}"], work / "doctor.log"),
        "scan": timed_command([*scan, "--kubeconfig", admin], work / "scan.log"),
        "scan --inventory": timed_command([*scan, "--inventory", str(dump)], work / "scan-inventory.log"),
    }


# --- the run ---------------------------------------------------------------------------------------

def run(args: argparse.Namespace, work: Path) -> dict:
    result: dict = {"form": args.form, "nodes": args.nodes, "images_per_node": args.images, "catalogue": args.catalogue,
                    "zipf": args.zipf, "digests": args.digests, "workers": args.workers, "seed": args.seed,
                    "pods_per_node": args.pods_per_node, "lease": args.lease, "kwok_lease": args.kwok_lease,
                    "gomaxprocs": os.environ.get("GOMAXPROCS", ""), "snapshots": [], "rounds": {}}
    rng = np.random.default_rng(args.seed)
    images = catalogue(args.catalogue, digests=args.digests, rng=rng)
    images.append(RuntimeImage(id="sha256:" + hashlib.sha256(SANDBOX_IMAGE.encode()).hexdigest(),
                               repo_tags=(SANDBOX_IMAGE,), size=320_000, pinned=True,
                               repo_digests=(f"registry.k8s.io/pause@sha256:{hashlib.sha256(b'pause').hexdigest()}",)))
    sets = draw_sets(args.nodes, args.images, holding_probabilities(args.catalogue, args.images, args.zipf), rng)
    result["sharing"] = sharing(sets, args.catalogue)
    names = [len(image.repo_tags[0]) for image in images[:-1]]
    result["name_length"] = {"min": min(names), "median": int(np.median(names)), "max": max(names)}

    folder, why = (None, "--no-kwok") if args.no_kwok else kwok_folder()
    result["kwok"] = str(folder) if folder else f"not used: {why}"
    receiver = SpanReceiver(names=frozenset({WEBHOOK_SPAN, "Create"})).start()
    plane = FleetControlPlane(work / "cp", lease_heartbeat=folder is None,
                              node_lease_s=args.kwok_lease if folder else KWOK_LEASE_S,
                              tracing_endpoint=receiver.endpoint)
    kwok: Process | None = None
    served: ServedWebhook | None = None
    watch: Watch | None = None
    rows = result["snapshots"]
    # The images most nodes hold: each Job names one, the same in turn on 3 nodes and on the fleet.
    held_by = np.bincount(np.concatenate(sets), minlength=len(images))
    widest = [images[int(i)].repo_tags[0] for i in np.argsort(-held_by, kind="stable")[:SPAN_IMAGES]]
    try:
        start = time.monotonic()
        plane.start()
        result["control_plane_start_s"] = time.monotonic() - start
        apply_service_accounts(plane)  # the chart's NodeImages CRD, namespaces, ServiceAccounts and roles
        webhook = Webhook(plane, work)  # and its webhook configuration, judging one namespace's Jobs
        reference = Reference(plane, work)  # the same again for the reference serve, judging another
        # One client for all the writers (each node's agent has its own; the requests are the same):
        # its pool holds 5 connections per CPU, more than --workers use at once.
        form = FORMS[args.form](plane, plane.api_client(), args.nodes, lease_s=args.lease)
        result["form_resources"] = list(form.resources)
        if folder is not None:
            kwok = start_kwok(plane, folder, work, lease_s=args.kwok_lease)
        alive = [p for p in (kwok, *plane.processes) if p is not None]

        # The webhook's call as the apiserver times it, on a cluster of a few nodes: the baseline.
        first = min(BASELINE_NODES, args.nodes)
        create_nodes(plane, range(first), kwok=kwok is not None, workers=args.workers)
        wait_ready(plane, first, NODES_READY_DEADLINE_S, alive)
        for index in range(first):
            form.write(index, *agent_listing(images, sets[index], index), time.time())
        if args.spans:
            served = webhook.serve()
            served.start(timeout_s=SERVE_READY_DEADLINE_S)
            result["spans"] = {"baseline_nodes": first, "baseline": timed_calls(
                plane, receiver, served, reference, form, images, sets, widest, seconds=args.spans, label="small")}
            served.stop()
            served = None
        for index in range(first):  # every list is written in round 1 below, as on a new cluster
            form.forget(index)

        start = time.monotonic()
        create_nodes(plane, range(first, args.nodes), kwok=kwok is not None, workers=args.workers)
        result["nodes_created_s"] = time.monotonic() - start
        result["nodes_ready_s"] = wait_ready(plane, args.nodes, NODES_READY_DEADLINE_S + 0.2 * args.nodes, alive)
        pods = args.pods_per_node * args.nodes
        if pods and kwok is not None:
            start = time.monotonic()
            create_pods(plane, pods, images[0].repo_tags[0], workers=args.workers)
            result["pods"] = {"count": pods, "created_s": time.monotonic() - start,
                              "running_s": wait_count(lambda: running_pods(plane), pods, "Pods Running",
                                                      NODES_READY_DEADLINE_S + 0.05 * pods, [kwok, *plane.processes])}
        watch = Watch(plane, args.max_apiserver_gib)

        # What the fleet writes without us: Leases (and kwok's node status), over --idle seconds.
        idle_before, idle_bytes = snapshot(plane, "nodes Ready, no lists", rows), request_bytes(plane)
        time.sleep(args.idle)
        idle_after, idle_bytes_after = snapshot(plane, f"after {args.idle:g} s idle", rows), request_bytes(plane)
        lease_bytes, lease_writes = received(idle_bytes_after, idle_bytes, ("leases",), WRITES)
        node_bytes, node_writes = received(idle_bytes_after, idle_bytes, ("nodes",), WRITES)
        result["idle"] = {"seconds": args.idle, "lease_writes": lease_writes, "lease_bytes": lease_bytes,
                          "node_writes": node_writes, "node_bytes": node_bytes,
                          "etcd_in_use_growth": idle_after["etcd_in_use"] - idle_before["etcd_in_use"]}
        # Compacted, as after compaction below, so that the live objects are the difference.
        compact(plane)
        snapshot(plane, BEFORE_LISTS, rows)

        threshold = args.lease * (1 - RENEW_WHEN_REMAINING)
        before = request_bytes(plane)
        # Observed a renewal period ago, so that the next round is the renewal an idle agent makes.
        created = write_round("create", form.write, args.nodes, sets, images,
                              observed_at=lambda: time.time() - threshold - 1,
                              workers=args.workers, watch=watch, deadline_s=args.round_deadline)
        after = request_bytes(plane)
        row = snapshot(plane, AFTER_ROUND_1, rows)
        row["apiserver_peak_rss_mib"] = max(watch.peak_mib, row["apiserver_rss_mib"])
        result["rounds"]["create"] = round_figures(created, *received(after, before, form.resources, WRITES),
                                                   sent_leases(form))

        if not created.stopped:
            before = after
            renewed = write_round("renew", form.renew, args.nodes, sets, images, observed_at=time.time,
                                  workers=args.workers, watch=watch, deadline_s=args.round_deadline)
            after = request_bytes(plane)
            row = snapshot(plane, AFTER_ROUND_2, rows)
            row["apiserver_peak_rss_mib"] = max(watch.peak_mib, row["apiserver_rss_mib"])
            result["rounds"]["renew"] = round_figures(renewed, *received(after, before, form.resources, WRITES),
                                                      sent_leases(form))

        compact(plane)
        row = snapshot(plane, AFTER_COMPACTION, rows)

        written = next((i for i in range(args.nodes) if form.stored(i)), None)
        if written is not None:
            name = node_name(written)
            result["object"] = {
                "node": name,
                "objects": [{"key": key, "json_bytes": len(json.dumps(obj, separators=(",", ":"))),
                             "etcd_value_bytes": etcd_value_bytes(plane, key)} for key, obj in form.stored(written)],
                "images": args.images + 1,  # and the sandbox image
                "node_etcd_value_bytes": etcd_value_bytes(plane, f"/registry/minions/{name}"),
                "lease_etcd_value_bytes": etcd_value_bytes(plane, f"/registry/leases/kube-node-lease/{name}"),
            }

        if args.serve and written is not None:
            # Every name the lists written hold, as serve counts them (image_preflight_inventory_images):
            # a round stopped early leaves some nodes without one.
            holders = [i for i in range(args.nodes) if form.stored(i)]
            names = sum(sets[i].size for i in holders) * (2 if args.digests else 1) + 2 * len(holders)
            served = webhook.serve()
            port, metrics_port, ca = served.port, served.metrics_port, webhook.certs / "ca.crt"
            start = time.monotonic()
            try:
                served.start(timeout_s=SERVE_READY_DEADLINE_S)  # /readyz answered 200
                ready_s = time.monotonic() - start
                held_s = wait_lists_held(served.popen, metrics_port, args.nodes, names,
                                         SERVE_READY_DEADLINE_S) + ready_s
                gauges = serve_gauges(metrics_port)
                core = next((i for i in range(100) if all(sets_hold(sets, i))), None)
                result["serve"] = {
                    "ready_s": ready_s, "lists_held_s": held_s,
                    "rss_mib": rss_mib(served.popen.pid), "peak_rss_mib": hwm_mib(served.popen.pid),
                    "cpu_s": tree_cpu_seconds([served.popen.pid]),
                    "inventory_nodes": gauges.get("image_preflight_inventory_nodes"),
                    "inventory_images": gauges.get("image_preflight_inventory_images"), "names_written": names,
                    "admits_an_image_every_node_holds": None if core is None
                    else decide(port, ca, images[core].repo_tags[0]),
                    "denies_an_image_no_node_holds": not decide(
                        port, ca, "docker.io/swebench/sweb.eval.x86_64.nobody_1776_nothing-1:openai"),
                    "change_to_decision_s": change_to_decision(form, holders[0], sets, images, port, ca),
                }
                if args.spans:
                    result["spans"]["fleet"] = timed_calls(plane, receiver, served, reference, form, images, sets,
                                                           widest, seconds=args.spans, label="fleet")
                if args.commands:
                    result["commands"] = commands_at_size(plane, work, images, sets[0], served.port, rng)
                # What renewals cost serve: one more round while it watches (due a renewal period on,
                # so its lists read as observed ahead of the clock from here: nothing is decided after).
                cpu = tree_cpu_seconds([served.popen.pid])
                again = write_round("renew, serve watching", form.renew, args.nodes, sets, images,
                                    observed_at=lambda: time.time() + threshold + 1, workers=args.workers,
                                    watch=watch, deadline_s=args.round_deadline)
                time.sleep(SETTLE_S)  # the round's last events reach serve
                result["serve"] |= {"renewal_round_cpu_s": tree_cpu_seconds([served.popen.pid]) - cpu,
                                    "renewal_round_written": again.written, "renewal_round_wall_s": again.wall_s}
            except RuntimeError as exc:
                result["serve"] = {"failed": str(exc), "log": tail(served.log)}
            snapshot(plane, "serve holding every list", rows)
        if kwok is not None:
            result["kwok_rss_mib"] = rss_mib(kwok.popen.pid)  # type: ignore[union-attr]  # started: popen is set
            result["kwok_cpu_s"] = tree_cpu_seconds([kwok.popen.pid])  # type: ignore[union-attr]  # started: popen is set
        result["apiserver_peak_rss_mib"] = watch.peak_mib
        result["apiserver_cpu_s"] = tree_cpu_seconds([plane.apiserver.popen.pid])  # type: ignore[union-attr]  # started: popen is set
        result["etcd_cpu_s"] = tree_cpu_seconds([plane.etcd.popen.pid])  # type: ignore[union-attr]  # started: popen is set
        result["etcd_errors"] = etcd_errors(plane)
        result["differences"] = differences(result)
        if kwok is not None:
            result["kwok_errors"], result["kwok_error_kinds"] = kwok_errors(work / "kwok.log")
    finally:
        if watch is not None:
            watch.stop()
        if served is not None:
            served.stop()
        if kwok is not None:
            kwok.stop()
        plane.stop()
        receiver.stop()
    return result


def sets_hold(sets: list[np.ndarray], index: int):
    for chosen in sets:
        position = np.searchsorted(chosen, index)
        yield position < chosen.size and chosen[position] == index


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def etcd_errors(plane: ControlPlane) -> list[str]:
    """The distinct errors the apiserver logged from etcd (a request too large, the quota)."""
    found = []
    for line in tail(plane.apiserver.log, 200_000).splitlines():
        for marker in ("request is too large", "database space exceeded", "etcdserver:"):
            if marker in line:
                text = line[line.find(marker):][:160]
                if text not in found:
                    found.append(text)
                break
    return found[:10]


def kwok_errors(log: Path) -> tuple[int, list[str]]:
    """How many errors kwok logged, and the distinct ones (its log is JSON, a line an entry)."""
    count, found = 0, []
    for line in tail(log, 100_000).splitlines():
        if '"level":"ERROR"' not in line:
            continue
        count += 1
        try:
            entry = json.loads(line)
        except ValueError:
            entry = {"msg": line}
        text = f"{entry.get('msg', '')}: {entry.get('err', '')}"[:200]
        if text not in found:
            found.append(text)
    return count, found[:5]


def sent_leases(form) -> tuple[int, int]:
    sent = getattr(form, "sent", None)
    return sent.take() if sent is not None else (0, 0)


def round_figures(done: Round, body_bytes: float, requests: int, leases: tuple[int, int] = (0, 0)) -> dict:
    """A round's figures; `leases`: the bytes and requests of the agents' Lease writes, as sent."""
    body_bytes, requests = body_bytes + leases[0], requests + leases[1]
    return {"written": done.written, "reasons": done.reasons, "failures": len(done.failures),
            "first_failures": done.failures[:3], "stopped": done.stopped, "wall_s": done.wall_s,
            "client_cpu_s": done.client_cpu_s,
            "write_p50_s": percentile(done.latencies, 0.5), "write_p99_s": percentile(done.latencies, 0.99),
            "write_max_s": max(done.latencies, default=float("nan")),
            "apiserver_received_bytes": body_bytes, "apiserver_requests": requests}


# --- output ----------------------------------------------------------------------------------------

def shown_s(value: float | None) -> str:
    return "not" if value is None else f"{value:.2f} s"


def mib(value: float | int | None) -> str:
    """Bytes in the unit that reads best."""
    if value is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}" if unit == "GiB" else f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def differences(result: dict) -> dict:
    """Differences between the measured rows, and the one rate they imply at the agent's renewal
    period: nothing here is estimated from a model of the objects."""
    out: dict = {}
    rows = {row["when"]: row for row in result["snapshots"]}
    base, r1 = rows.get(BEFORE_LISTS), rows.get(AFTER_ROUND_1)
    r2, compacted = rows.get(AFTER_ROUND_2), rows.get(AFTER_COMPACTION)
    if base and r1:
        out["etcd in use, round 1 (the lists written)"] = r1["etcd_in_use"] - base["etcd_in_use"]
        out["etcd db, round 1"] = r1["etcd_db"] - base["etcd_db"]
        out["kube-apiserver RSS, round 1"] = (r1["apiserver_rss_mib"] - base["apiserver_rss_mib"]) * 2**20
    if r1 and r2:
        out["etcd in use, round 2 (one renewal each)"] = r2["etcd_in_use"] - r1["etcd_in_use"]
        out["etcd db, round 2"] = r2["etcd_db"] - r1["etcd_db"]
        out["kube-apiserver RSS, round 2"] = (r2["apiserver_rss_mib"] - r1["apiserver_rss_mib"]) * 2**20
    if base and compacted:
        out["etcd in use, compacted after vs compacted before (the live objects)"] = \
            compacted["etcd_in_use"] - base["etcd_in_use"]
    renew, idle = result["rounds"].get("renew"), result.get("idle")
    if renew and renew["apiserver_requests"] and idle and idle["lease_writes"]:
        renew_every = LEASE_S * (1 - RENEW_WHEN_REMAINING)
        lease_rate = idle["lease_bytes"] / idle["seconds"] / result["nodes"]
        renewal_rate = renew["apiserver_received_bytes"] / renew["apiserver_requests"] / renew_every
        out[f"a node's Lease writes per s (idle {idle['seconds']:g} s)"] = lease_rate
        out[f"a node's renewals per s (its renewal request every {renew_every:g} s)"] = renewal_rate
        out["renewals over Lease writes"] = renewal_rate / lease_rate
    return out


def milliseconds(sample: dict, name: str) -> str:
    """A call's p50 / p90 / p99 in ms, from job_spans' figures."""
    return " / ".join(f"{sample[f'{name}_p{q}_s'] * 1e3:.1f}" for q in (50, 90, 99)) + " ms"


def over(sample: dict) -> str:
    """The webhook's call over the reference's, at p50 / p90 / p99."""
    return " / ".join(f"{sample[f'webhook_p{q}_s'] / sample[f'reference_p{q}_s']:.2f}" for q in (50, 90, 99))


def report(result: dict) -> str:
    lines = [f"form {result['form']}; fleet: {result['nodes']:,} nodes x {result['images_per_node']:,} images "
             f"(catalogue {result['catalogue']:,}, zipf {result['zipf']}, digests {result['digests']}); "
             f"kwok: {result['kwok']} (node Leases of {result['kwok_lease']} s); the lists' lease {result['lease']} s"]
    share = result["sharing"]
    lines.append(f"sharing: {share['distinct_images']:,} distinct images, {share['images_on_every_node']:,} on every "
                 f"node, {share['images_on_at_most_5pct']:,} on <= 5 % of nodes; "
                 f"{share['pairs_on_90pct_or_more']:.0%} of (node, image) pairs are images on >= 90 % of nodes, "
                 f"{share['pairs_on_half_or_more']:.0%} on >= half; names {result['name_length']['min']}-"
                 f"{result['name_length']['max']} chars")
    lines.append(f"control plane start {result.get('control_plane_start_s', 0):.1f} s; nodes created in "
                 f"{result.get('nodes_created_s', 0):.1f} s, Ready after {result.get('nodes_ready_s', 0):.1f} s more"
                 + (f"; {result['pods']['count']:,} Pods created in {result['pods']['created_s']:.1f} s, Running "
                    f"after {result['pods']['running_s']:.1f} s more" if "pods" in result else ""))
    lines.append("")
    lines.append("| when | etcd db (etcd_mvcc_db_total_size_in_bytes) | etcd in use (…_in_use_in_bytes) "
                 "| kube-apiserver RSS (VmRSS; peak sampled every 0.25 s) | etcd RSS |")
    lines.append("|---|---|---|---|---|")
    for row in result["snapshots"]:
        peak = f" (peak {row['apiserver_peak_rss_mib']:,.0f})" if "apiserver_peak_rss_mib" in row else ""
        lines.append(f"| {row['when']} | {mib(row['etcd_db'])} | {mib(row['etcd_in_use'])} | "
                     f"{row['apiserver_rss_mib']:,.0f} MiB{peak} | {row['etcd_rss_mib']:,.0f} MiB |")
    lines.append("")
    lines.append("| round | written | failed | wall | per write p50 / p99 / max | apiserver received "
                 "(apiserver_request_body_size_bytes) | per request |")
    lines.append("|---|---|---|---|---|---|---|")
    for name, r in result["rounds"].items():
        per = r["apiserver_received_bytes"] / r["apiserver_requests"] if r["apiserver_requests"] else None
        lines.append(f"| {name} | {r['written']:,} | {r['failures']:,} | {r['wall_s']:.1f} s | "
                     f"{r['write_p50_s'] * 1e3:.0f} / {r['write_p99_s'] * 1e3:.0f} / {r['write_max_s'] * 1e3:.0f} ms | "
                     f"{mib(r['apiserver_received_bytes'])} in {r['apiserver_requests']:,} requests | {mib(per)} |")
        for failure in r["first_failures"]:
            lines.append(f"  failed: {failure}")
        if r["stopped"]:
            lines.append(f"  stopped early: {r['stopped']}")
    if "leases" in result.get("form_resources", ()):
        lines.append("  (the rounds' bytes include kwok's node Lease renewals: see idle below)")
    idle = result.get("idle")
    if idle:
        lines.append("")
        lines.append(f"idle {idle['seconds']:g} s before the lists: {idle['lease_writes']:,} Lease writes "
                     f"({mib(idle['lease_bytes'])}), {idle['node_writes']:,} Node status writes "
                     f"({mib(idle['node_bytes'])}); etcd in use grew {mib(idle['etcd_in_use_growth'])}")
    obj = result.get("object")
    if obj:
        written = "; ".join(f"{o['key']}: {o['json_bytes']:,} bytes of JSON as last written, "
                            f"{o['etcd_value_bytes'] or 0:,} in etcd" for o in obj["objects"])
        lines.append(f"node {obj['node']} ({obj['images']:,} images) wrote {written}; beside its Node "
                     f"({obj['node_etcd_value_bytes'] or 0:,} bytes in etcd) and its Lease "
                     f"({obj['lease_etcd_value_bytes'] or 0:,})")
    serve = result.get("serve")
    if serve:
        if "failed" in serve:
            lines.append(f"serve: FAILED {serve['failed']}")
        else:
            lines.append(f"serve (the webhook's ServiceAccount): /readyz 200 {serve['ready_s']:.1f} s after start, "
                         f"every list held {serve['lists_held_s']:.1f} s after start; then RSS "
                         f"{serve['rss_mib']:,.0f} MiB (peak {serve['peak_rss_mib']:,.0f}), "
                         f"CPU {serve['cpu_s']:.1f} s; "
                         f"inventory {serve['inventory_nodes']:,.0f} nodes, {serve['inventory_images']:,.0f} names "
                         f"({serve['names_written']:,} written); "
                         f"admits a core image: {serve['admits_an_image_every_node_holds']}, "
                         f"denies an absent one: {serve['denies_an_image_no_node_holds']}; an image built on one "
                         f"node admitted for it {shown_s(serve.get('change_to_decision_s'))} after its agent wrote it; "
                         f"a renewal round of {serve.get('renewal_round_written', 0):,} writes cost it "
                         f"{serve.get('renewal_round_cpu_s', 0):.1f} CPU s (one every "
                         f"{LEASE_S * (1 - RENEW_WHEN_REMAINING):g} s)")
    spans = result.get("spans", {})
    for when, label in (("baseline", f"{spans.get('baseline_nodes')} nodes"), ("fleet", f"{result['nodes']:,} nodes")):
        if when in spans:
            sp = spans[when]
            lines.append(f"Jobs at {sp['rate']:g}/s, dryRun, on {label}: {sp['answers']}; the apiserver's spans: "
                         f"webhook call p50 / p90 / p99 {milliseconds(sp, 'webhook')} ({sp['calls']} of "
                         f"{sp['judged_jobs']} judged Jobs), the reference's on {spans.get('baseline_nodes')} nodes "
                         f"at the same moments "
                         f"{milliseconds(sp, 'reference')} ({sp['reference_calls']} of {sp['reference_jobs']}), "
                         f"the webhook's over the reference's {over(sp)}; Create, judged "
                         f"{sp['create_judged_p50_s'] * 1e3:.1f} / {sp['create_judged_p99_s'] * 1e3:.1f} ms, unjudged "
                         f"{sp['create_unjudged_p50_s'] * 1e3:.1f} / {sp['create_unjudged_p99_s'] * 1e3:.1f} ms; "
                         f"serve's own answer (its /metrics) {(sp['serve_mean_s'] or 0) * 1e3:.2f} ms mean over "
                         f"{sp['serve_answered']:g} reviews, the reference's {(sp['reference_mean_s'] or 0) * 1e3:.2f} "
                         f"ms over {sp['reference_answered']:g}; inventories published meanwhile, by what changed: "
                         f"{sp.get('serve_publications') or 'none'}; nodes tainted after, by taint: "
                         f"{sp.get('node_taints_after') or 'none'}")
    for name, c in result.get("commands", {}).items():
        lines.append(f"{name} (admin kubeconfig, {DATASET_ROWS:,} rows for scan): {c['wall_s']:.1f} s, CPU "
                     f"{c['cpu_s']:.1f} s, peak RSS {c['peak_rss_mib']:,.0f} MiB, exit {c['exit']}: {c['last_line']}")
    lines.append(f"kube-apiserver peak RSS {result.get('apiserver_peak_rss_mib', 0):,.0f} MiB, CPU "
                 f"{result.get('apiserver_cpu_s', 0):.0f} s; etcd CPU {result.get('etcd_cpu_s', 0):.0f} s"
                 + (f"; kwok RSS {result['kwok_rss_mib']:,.0f} MiB, CPU {result['kwok_cpu_s']:.0f} s, "
                    f"{result['kwok_errors']} errors logged" if "kwok_rss_mib" in result else ""))
    for error in result.get("etcd_errors", []):
        lines.append(f"apiserver logged: {error}")
    for error in result.get("kwok_error_kinds", []):
        lines.append(f"kwok logged: {error}")
    d = result.get("differences", {})
    if d:
        lines.append("")
        lines.append("differences between the rows above; a node's rates from request bodies the apiserver received:")
        for key, value in d.items():
            if key.endswith("per s)"):
                shown = f"{mib(value)}/s"
            elif key.startswith("renewals over"):
                shown = f"{value:,.3g}x"
            else:
                shown = mib(value)
            lines.append(f"  {key}: {shown}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, help="fake nodes (default 200; 300 with --quick)")
    parser.add_argument("--images", type=int, default=5000, help="images per node")
    parser.add_argument("--form", choices=tuple(FORMS), default="today", help="what each node's agent writes")
    parser.add_argument("--quick", action="store_true",
                        help="a run of a few minutes: --nodes 300, --idle 20 unless given")
    parser.add_argument("--catalogue", type=int, default=0, help="distinct images to draw from (default 4 x --images)")
    parser.add_argument("--zipf", type=float, default=2.0, help="the popularity curve's exponent")
    parser.add_argument("--digests", action="store_true", help="a repo digest per image as well as its tag")
    parser.add_argument("--workers", type=int, default=4, help="agents writing at once")
    parser.add_argument("--pods-per-node", type=int, default=0, help="Pods kwok runs on the fleet (with kwok only)")
    parser.add_argument("--idle", type=float, help="seconds of the fleet's own writes measured first (default 30)")
    parser.add_argument("--round-deadline", type=float, default=600.0, help="seconds a round may take")
    parser.add_argument("--max-apiserver-gib", type=float, default=8.0,
                        help="stop a round once kube-apiserver's RSS passes this")
    parser.add_argument("--no-kwok", action="store_true", help="API-created nodes kept Ready by a Lease heartbeat")
    parser.add_argument("--kwok-lease", type=int, default=KWOK_LEASE_S,
                        help="kwok's node Lease duration in seconds (renewed every quarter of it)")
    parser.add_argument("--lease", type=int, default=LEASE_S,
                        help="the lease the agents' lists carry; rates are given at the default's renewal period. "
                             "Longer keeps them current when a round takes longer than a renewal period")
    parser.add_argument("--no-serve", dest="serve", action="store_false")
    parser.add_argument("--spans", type=float, default=60.0,
                        help="seconds of Jobs (20 a second, in turn to the webhook, the reference and neither) "
                             "timed by the apiserver's spans on 3 nodes and on the fleet (0: none)")
    parser.add_argument("--no-commands", dest="commands", action="store_false",
                        help="skip timing inventory dump, doctor and scan at size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    args.nodes = args.nodes or (300 if args.quick else 200)
    args.idle = args.idle if args.idle is not None else (20.0 if args.quick else 30.0)
    args.catalogue = args.catalogue or 4 * args.images
    if not (1 <= args.nodes <= 5000 and 1 <= args.images <= args.catalogue and 1 <= args.workers <= 64
            and 0 <= args.pods_per_node <= 110):
        parser.error("--nodes 1..5000, --images 1..--catalogue, --workers 1..64, --pods-per-node 0..110")
    require_control_plane()
    # A SIGTERM (timeout, a CI job cancelled) unwinds like ^C, so that every process is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
        result = run(args, Path(tmp))
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
