"""image-preflight beside the policies a cluster operator would write instead, on the same Jobs
through the same apiserver: OPA Gatekeeper, Kyverno and a ValidatingAdmissionPolicy in CEL, each
in two shapes: the first its docs show, and as its best user writes it (benchmarks/peer_setups.py,
benchmarks/peers/*.yaml).

    benchmarks/peers/build                                   # once: Gatekeeper and Kyverno, cached
    .venv/bin/python benchmarks/side_by_side.py --real-node  # --seconds 30 --rate 20 --clients 4 --runs 3
    .venv/bin/python benchmarks/side_by_side.py --real-node --fleet 1000

1. Decisions. Rollout Jobs as agent-lightning renders them for SWE-smith rows (and the Pod a
   Deployment makes), against one cluster state: a worker whose runtime holds 53 images, of which
   its status lists the 50 largest with at most 5 names each; a tainted GPU node, a cordoned node
   and a not-ready node, each the only holder of an image; a pool of two nodes, one holding an
   image; a node whose agent is down and whose status is at the cap. Each case says what the
   kubelet then does, and so whether admitting it was right. With --real-node the worker is the
   tests' real node, its status the kubelet's own, and every case also runs there, judged by no
   policy, so that the node shows what its Pod meets; without, the worker is a containerd 2.x and
   an API object whose status is made the kubelet's way from the node agent's CRI list.
2. Latency, interleaved: dry-run creations of Jobs each naming an image no node holds and no
   request named before (so no policy answers from memory), the peers taken in turn, at a fixed
   rate and then by --clients threads as fast as they go. Per peer: the client's p50/p99, the
   apiserver's own spans (KEP-647 tracing: "Create" for the whole request, "Call validating
   webhook" for the webhook call, counted against the creations), and the CPU and RSS of the
   peer's processes (image-preflight's: serve and the node agent).

With --fleet N, N more nodes beside them, each listing the worker's status images, in a pool
tainted so that no case lands there: every policy that reads Nodes reads them all. A peer that
cannot be set up as written there, or never tells the held image from the absent one, is left out
of the tables with the reason printed.

Needs tests/controlplane/build's folder on PATH (and root, for --real-node). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from benchmarks import peer_setups as setups
from benchmarks.figures import percentile, tree_cpu_seconds, tree_rss_mib
from tests.agent_lightning import TEMPLATE, build_job_spec, example_row
from tests.containerd import Containerd, build_oci_archive_many, containerd2_binary, ctr
from tests.controlplane.cluster import (
    apply_service_accounts,
    create_node,
    new_namespace,
    running_control_plane,
    wait_for,
)
from tests.controlplane.tracing import WEBHOOK_SPAN, SpanReceiver
from tests.node.real_node import RealNode, missing_parts

PEERS = ("none", "cel", "cel-best", "gatekeeper", "gatekeeper-best", "kyverno", "kyverno-best", "image-preflight")
ROW = "marshmallow-code__marshmallow.9716fc62.func_pm_op_swap__0c5c7fd0"  # a row of examples/swe-smith/train.jsonl

# --- the cluster ---------------------------------------------------------------------------------

WORKER, GPU, CORDONED = "cpu-worker", "gpu-worker", "cpu-cordoned"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_LABEL = {"nvidia.com/gpu.present": "true"}
MAX_IMAGES = 50  # KubeletConfiguration.nodeStatusMaxImages, its default
PAUSE = "registry.k8s.io/pause:3.10"  # in every node's status: the sandbox image its runtime keeps
NAMES_PER_IMAGE = 5  # pkg/kubelet/nodestatus/setters.go, MaxNamesPerImageInNodeStatus


def program(peer: str) -> str:
    """What runs a peer's shapes: "gatekeeper" for gatekeeper-best too."""
    return peer.split("-")[0]


def smith(name: str) -> str:
    return f"docker.io/swe-smith/{name}:openai"


# The worker's runtime. The larger images fill its status; the smaller ones are cut from it.
LARGE = [smith(f"filler-{i:02d}") for i in range(46)] + [
    smith("held"), smith("alias-1"), smith("pinned"), "docker.io/library/python:3.12"]
SMALL = [smith("beyond-cap"), smith("small-1"), smith("small-2")]
ALIASES = [smith(f"alias-{i}") for i in range(2, 7)]  # more names of alias-1's image


def kubelet_status_images(published: dict) -> list[dict]:
    """node.status.images as the kubelet posts it from the runtime's list (the agent's, the same
    CRI ListImages): pkg/kubelet/nodestatus/setters.go Images cuts the list, sorted by size
    (pkg/kubelet/images/image_gc_manager.go), at nodeStatusMaxImages, and each image's names
    (repoDigests, then repoTags) at MaxNamesPerImageInNodeStatus."""
    images = sorted(published["spec"]["images"], key=lambda image: -int(image.get("size") or 0))[:MAX_IMAGES]
    return [{"names": ([*image.get("repoDigests", []), *image.get("repoTags", [])])[:NAMES_PER_IMAGE],
             "sizeBytes": int(image.get("size") or 0)} for image in images]


def fill_runtime(ctr, folder: Path) -> str:
    """Import the worker's images with `ctr` (args -> stdout, in the k8s.io namespace); `pinned`
    is left under its digest only, as a pull by digest leaves it. Returns that digest. The large
    images outweigh the real node's pause image, the small ones do not."""
    large, small = folder / "large.tar", folder / "small.tar"
    build_oci_archive_many(large, LARGE, layer_bytes=random.randbytes(8 << 20))
    build_oci_archive_many(small, SMALL)
    ctr("images", "import", str(large))
    ctr("images", "import", str(small))
    ctr("images", "tag", smith("alias-1"), *ALIASES)
    digest = next(row.split()[2] for row in ctr("images", "ls").splitlines()[1:] if row.split()[0] == smith("pinned"))
    ctr("images", "tag", smith("pinned"), f"docker.io/swe-smith/pinned@{digest}")
    ctr("images", "rm", smith("pinned"))
    return digest


FLEET = "fleet"


def add_fleet(plane, count: int, images: list[list[str]]) -> None:
    """`count` more nodes, each listing the worker's status images, in a pool of their own (tainted,
    so that no case lands there and no answer changes): what every policy reading Nodes must read."""
    from concurrent.futures import ThreadPoolExecutor

    taint = {"key": POOL_KEY, "value": FLEET, "effect": "NoSchedule"}

    def one(index: int) -> None:
        create_node(plane, f"{FLEET}-{index:05d}", labels={POOL_KEY: FLEET}, taints=[taint], images=images,
                    wait_ready=False)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))
    core = plane.core()
    wait_for(lambda: not any(t.key == "node.kubernetes.io/not-ready"
                             for node in core.list_node(label_selector=f"{POOL_KEY}={FLEET}").items
                             for t in node.spec.taints or ()),
             f"{count} fleet nodes Ready", timeout_s=600, interval_s=2.0)


# --- the cases -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    admit: bool  # right answer: admit unless a Pod would wait for an image that is not there
    why: str
    image: str
    policy: str | None = "IfNotPresent"  # None: left out, as a template may (the apiserver defaults it)
    init_image: str | None = None
    volume_image: str | None = None  # an image volume's reference, IfNotPresent, mounted by the container
    suspend: bool = False
    resume: bool = False  # created suspended, then resumed by an UPDATE: the answer to the UPDATE
    on_gpu: bool = False  # selects the GPU node and tolerates its taint
    avoid_gpu: bool = False  # tolerates the GPU taint, its required node affinity excludes GPU nodes
    on_worker_by_name: bool = False  # nodeName the worker: no scheduler
    pool: str | None = None  # selects a pool of nodes and tolerates the pool's taint
    pod: bool = False  # the Pod a Deployment's ReplicaSet creates, not a Job


# Pools of nodes no other case lands on: each tainted with its name, which only its cases tolerate.
PAIR, STALE, NOT_READY = "pair", "stale", "cpu-not-ready"
POOL_KEY = "image-preflight.test/pool"


def cases(digest: str) -> list[Case]:
    """Each with what the kubelet does with its Pod: pkg/kubelet/images/image_manager.go
    EnsureImageExists (IfNotPresent: the runtime's ImageStatus of the normalised reference, else a
    pull; Never: ErrImageNeverPull), after the scheduler's TaintToleration, NodeUnschedulable,
    NodeAffinity and NodeName filters chose the node (here the worker, unless the Job selects
    another pool)."""
    return [
        Case("held, listed in status", True, "runs on the worker", "swe-smith/held:openai"),
        Case("absent everywhere", False, "ErrImagePull, then ImagePullBackOff", "swe-smith/absent:openai"),
        Case("short name of a library image", True, "runs: the runtime normalises python:3.12", "python:3.12"),
        Case("held, beyond the 50-image cap", True, "runs: held, only cut from status", "swe-smith/beyond-cap:openai"),
        Case("held, its sixth name", True, "runs: the name is cut from status, not from the runtime",
             "swe-smith/alias-6:openai"),
        Case("held by digest, named by digest", True, "runs", f"swe-smith/pinned@{digest}"),
        Case("held by digest, named by tag", False, "ErrImagePull: the tag resolves to nothing held",
             "swe-smith/pinned:openai"),
        Case("held by digest, named by tag and digest", True,
             "runs: a reference with both is resolved by its digest (distribution/reference ParseDockerRef)",
             f"swe-smith/pinned:openai@{digest}"),
        Case("only on the tainted GPU node", False, "scheduled to the worker, ErrImagePull",
             "swe-smith/gpu-only:openai"),
        Case("on the GPU node, selected and tolerated", True, "runs on the GPU node", "swe-smith/gpu-only:openai",
             on_gpu=True),
        Case("on the GPU node, tolerated, affinity excludes it", False,
             "required node affinity leaves the worker: ErrImagePull", "swe-smith/gpu-only:openai", avoid_gpu=True),
        Case("on the GPU node, nodeName the worker", False,
             "no scheduler: the worker's kubelet pulls, ErrImagePull", "swe-smith/gpu-only:openai",
             on_worker_by_name=True),
        Case("only on the cordoned node", False, "scheduled to the worker, ErrImagePull",
             "swe-smith/cordoned-only:openai"),
        Case("only on a not-ready node", False, "its not-ready taint (NoSchedule) sends it to the worker: ErrImagePull",
             "swe-smith/not-ready-only:openai"),
        Case("on one of two nodes it may land on", False,
             "the scheduler may choose either (ImageLocality scores, it does not filter): ErrImagePull on the other",
             "swe-smith/pair-one:openai", pool=PAIR),
        Case("agent down, capped status, held beyond the cap", True,
             "runs: held, only cut from status (no real node here: the status is built so)",
             "swe-smith/stale-beyond-cap:openai", pool=STALE),
        Case("agent down, capped status, absent", False,
             "ErrImagePull (no real node here: the runtime is said not to hold it)",
             "swe-smith/stale-absent:openai", pool=STALE),
        Case("absent, imagePullPolicy Always", True, "pulled from its registry: not a node-local image",
             "swe-smith/absent:openai", policy="Always"),
        Case("absent, :latest, no imagePullPolicy", True,
             "defaulted to Always (SetDefaults_Container): pulled, not node-local", "swe-smith/absent:latest",
             policy=None),
        Case("absent, Job suspended", True, "no Pod until resumed (the Job controller)", "swe-smith/absent:openai",
             suspend=True),
        Case("absent, suspended Job resumed by UPDATE", False, "its Pods then wait: ErrImagePull",
             "swe-smith/absent:openai", resume=True),
        Case("held, imagePullPolicy Never", True, "runs", "swe-smith/held:openai", policy="Never"),
        Case("absent, imagePullPolicy Never", False, "ErrImageNeverPull", "swe-smith/absent:openai", policy="Never"),
        Case("init container absent", False, "Init:ErrImagePull", "swe-smith/held:openai",
             init_image="swe-smith/absent:openai"),
        Case("image volume absent", False,
             "pulled as a container's image; the container mounting it waits (kuberuntime_manager.go "
             "toKubeContainerImageVolumes)",
             "swe-smith/held:openai", volume_image="swe-smith/absent:openai"),
        Case("absent, a Deployment's Pod", False, "ErrImagePull", "swe-smith/absent:openai", pod=True),
    ]


def rollout_job(case: Case, template_job: dict, *, worker: str = WORKER) -> dict:
    """agent-lightning's Job for the row, with the case's image and changes; `worker` the node a
    case naming it is bound to."""
    job = copy.deepcopy(template_job)
    job["metadata"]["name"] = f"agl-rollout-{uuid.uuid4().hex[:8]}"
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    container["image"] = case.image
    if case.policy is None:
        container.pop("imagePullPolicy", None)
    else:
        container["imagePullPolicy"] = case.policy
    if case.init_image:
        pod["initContainers"] = [{"name": "fetch", "image": case.init_image, "imagePullPolicy": "IfNotPresent",
                                  "command": ["true"]}]
    if case.volume_image:
        pod.setdefault("volumes", []).append({"name": "tools", "image": {"reference": case.volume_image,
                                                                         "pullPolicy": "IfNotPresent"}})
        container.setdefault("volumeMounts", []).append({"name": "tools", "mountPath": "/tools"})
    if case.suspend or case.resume:
        job["spec"]["suspend"] = True
    if case.on_gpu:
        pod["nodeSelector"] = dict(GPU_LABEL)
    if case.on_gpu or case.avoid_gpu:
        pod["tolerations"] = [{"key": GPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    if case.avoid_gpu:
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": key, "operator": "NotIn", "values": [value]}
                                  for key, value in GPU_LABEL.items()]}]}}}
    if case.on_worker_by_name:
        pod["nodeName"] = worker
    if case.pool:
        pod["nodeSelector"] = {POOL_KEY: case.pool}
        pod["tolerations"] = [{"key": POOL_KEY, "value": case.pool, "effect": "NoSchedule"}]
    return job


def replica_pod(job: dict) -> dict:
    """The Pod a ReplicaSet makes from the same template (pkg/controller/controller_utils.go GetPodFromTemplate)."""
    template = job["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": job["metadata"]["name"], "labels": dict(template["metadata"].get("labels") or {})},
            "spec": {**template["spec"], "restartPolicy": "Always"}}


def answer_of(batch: k8s.BatchV1Api, namespace: str, case: Case, template_job: dict, worker: str) -> bool | str:
    """The policy's answer to the case's request, a Job's create, a Pod's create, or the UPDATE
    that resumes a Job (a Job whose create was denied is never resumed): True, False (denied), or
    the error when neither."""
    job = rollout_job(case, template_job, worker=worker)
    try:
        if case.pod:
            k8s.CoreV1Api(batch.api_client).create_namespaced_pod(namespace, replica_pod(job), dry_run="All",
                                                                  _request_timeout=30)
        elif case.resume:
            batch.create_namespaced_job(namespace, job, _request_timeout=30)
            try:
                batch.patch_namespaced_job(job["metadata"]["name"], namespace, {"spec": {"suspend": False}},
                                           dry_run="All", _request_timeout=30)
            finally:
                batch.delete_namespaced_job(job["metadata"]["name"], namespace, propagation_policy="Background")
        else:
            batch.create_namespaced_job(namespace, job, dry_run="All", _request_timeout=30)
        return True
    except ApiException as exc:
        return False if 400 <= exc.status < 500 else f"HTTP {exc.status}"


# --- what the real node does ----------------------------------------------------------------------

# Why a container waits for an image: its pull failed, or its image volume's did (toKubeContainerImageVolumes).
PULL_FAILURES = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "CreateContainerError"}
OBSERVE_S = 90.0


def fate(pod) -> str | None:
    """What became of the Pod's images on its node, once that is known."""
    statuses = [*(pod.status.init_container_statuses or ()), *(pod.status.container_statuses or ())]
    for status in statuses:
        if status.state.waiting and status.state.waiting.reason in PULL_FAILURES:
            return f"{status.state.waiting.reason}: waits"
    if statuses and all(s.image_id or s.state.running or s.state.terminated for s in statuses
                        if s.name in {c.name for c in pod.spec.containers}):
        return "image there"  # the test images run no command: that the runtime resolved it is enough
    return None


def observe_on_node(plane, worker: Worker, all_cases: list[Case], template_job: dict) -> list[str]:
    """Each case's Job (or Pod) created for real, in a namespace no policy judges, a resumed Job
    as it runs once resumed: what its Pod met."""
    namespace = new_namespace(plane, rollout_scripts=True)
    batch = k8s.BatchV1Api(plane.api_client())
    core = plane.core()
    selectors: list[dict[str, str]] = []  # how to list each case's Pods
    for case in all_cases:
        job = rollout_job(case, template_job, worker=worker.name)
        name = job["metadata"]["name"]
        if case.pod:
            core.create_namespaced_pod(namespace, replica_pod(job))
            selectors.append({"field_selector": f"metadata.name={name}"})
            continue
        job["spec"]["activeDeadlineSeconds"] = int(OBSERVE_S) * 2
        job["spec"]["suspend"] = case.suspend
        batch.create_namespaced_job(namespace, job)
        selectors.append({"label_selector": f"batch.kubernetes.io/job-name={name}"})
    found: dict[int, str] = {}
    deadline = time.monotonic() + OBSERVE_S
    awaited = sum(not case.suspend for case in all_cases)  # a suspended Job's Pod is awaited to the deadline
    while len(found) < awaited and time.monotonic() < deadline:
        for index, selector in enumerate(selectors):
            if index in found:
                continue
            for pod in core.list_namespaced_pod(namespace, **selector).items:
                if pod.spec.node_name and pod.spec.node_name != worker.name:
                    found[index] = f"bound to {pod.spec.node_name}: no kubelet runs it here"
                elif (seen := fate(pod)) is not None:
                    found[index] = seen
        time.sleep(1.0)
    core.delete_namespace(namespace)
    return [found.get(index) or ("no Pod: suspended" if case.suspend else "undecided")
            for index, case in enumerate(all_cases)]


# --- latency -------------------------------------------------------------------------------------

def run_phase(plane, peers, new_job: Callable[[], dict], seconds: float, *, rate: float | None,
              clients: int) -> dict[str, list[float]]:
    """Dry-run creations of `new_job()`s, the peers in a shuffled turn, for `seconds`: at `rate` a
    second in all (one client), or as fast as `clients` threads go. Latencies by peer."""
    latencies: dict[str, list[float]] = {peer.name: [] for peer in peers}
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    failures: list[BaseException] = []

    def client() -> None:
        try:
            send(k8s.BatchV1Api(plane.api_client()))
        except BaseException as exc:  # raised again in the main thread, after the others end
            failures.append(exc)

    def send(batch: k8s.BatchV1Api) -> None:
        turn: list = []
        next_at = time.monotonic()
        while time.monotonic() < stop:
            if not turn:
                turn = random.sample(peers, len(peers))
            peer = turn.pop()
            if rate is not None:
                next_at += 1 / rate
                time.sleep(max(0.0, next_at - time.monotonic()))
            job = new_job()
            start = time.perf_counter()
            try:
                batch.create_namespaced_job(peer.namespace, job, dry_run="All", _request_timeout=30)
            except ApiException as exc:
                if not 400 <= exc.status < 500:  # a policy's denial
                    raise
            elapsed = time.perf_counter() - start
            with lock:
                latencies[peer.name].append(elapsed)

    threads = [threading.Thread(target=client) for _ in range(1 if rate is not None else clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return latencies


def span_seconds(receiver: SpanReceiver, peer) -> tuple[list[float], list[float]]:
    """The apiserver's "Create" spans of Jobs in the peer's namespace, and its webhook call spans."""
    creates = [s.seconds for s in receiver.spans("Create")
               if s.attributes.get("namespace") == peer.namespace and s.attributes.get("resource") == "jobs"]
    calls = [s.seconds for s in receiver.spans(WEBHOOK_SPAN)
             if peer.webhook and s.attributes.get("webhook", "").startswith(peer.webhook)]
    return creates, calls


# --- the run -------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--peers", default=",".join(PEERS), help="which to run, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each latency phase")
    parser.add_argument("--rate", type=float, default=20.0, help="creations a second in the fixed-rate phase")
    parser.add_argument("--clients", type=int, default=4, help="threads in the saturation phase")
    parser.add_argument("--runs", type=int, default=3, help="runs of each latency phase")
    parser.add_argument("--fleet", type=int, default=0,
                        help="more nodes, API objects listing the worker's status images, tainted so that no case "
                             "lands there: what the policies reading Nodes must read")
    parser.add_argument("--real-node", action="store_true",
                        help="the worker is the tests' real node (kubelet and containerd, root): its status is "
                             "the kubelet's own, and each Job also runs there, unjudged, its Pod's fate printed")
    args = parser.parse_args()
    chosen = [name.strip() for name in args.peers.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)})")
    binaries = setups.peers_folder() if {"gatekeeper", "kyverno"} & {program(name) for name in chosen} else None
    if args.real_node and (reason := missing_parts()) is not None:
        parser.error(f"--real-node: {reason}")
    folder = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    receiver = SpanReceiver().start()
    try:
        with running_control_plane(folder / "plane", tracing_endpoint=receiver.endpoint) as plane:
            stoppers: list = []  # what each setup started, stopped before the control plane
            try:
                worker = start_worker(plane, args.real_node, stoppers)
                return measure(plane, worker, receiver, chosen, binaries, folder, args, stoppers)
            finally:
                for stop in reversed(stoppers):
                    stop()
    finally:
        receiver.stop()
        print(f"\nlogs: {folder}", file=sys.stderr)


@dataclass
class Worker:
    name: str
    endpoint: str  # its runtime's CRI socket
    ctr: Callable[..., str]
    real: RealNode | None = None


def start_worker(plane, real: bool, stoppers: list) -> Worker:
    """The real node, or a containerd 2.x whose Node is an API object."""
    if real:
        node = RealNode(plane)
        stoppers.append(lambda: stop_real_node(node))
        node.start()
        return Worker(node.name, node.endpoint, node.ctr, node)
    runtime = Containerd(binary=containerd2_binary())
    stoppers.append(runtime.close)
    runtime.start()
    create_node(plane, WORKER, taints=[])
    return Worker(WORKER, runtime.endpoint, lambda *args: ctr(runtime.socket, *args, client=runtime.ctr))


def stop_real_node(node: RealNode) -> None:
    problems = node.stop()
    if outside := node.outside_requests():
        problems.append("containerd reached beyond the stub registry: " + "; ".join(outside[:5]))
    if problems:
        raise SystemExit("real node: " + "; ".join(problems))


def measure(plane, worker: Worker, receiver, chosen, binaries, folder, args, stoppers) -> int:
    digest = fill_runtime(worker.ctr, folder)
    create_node(plane, GPU, taints=[GPU_TAINT], labels=GPU_LABEL,
                images=[["docker.io/swe-smith/gpu-only:openai"]])
    create_node(plane, CORDONED, taints=[], unschedulable=True,
                images=[["docker.io/swe-smith/cordoned-only:openai"]])
    create_node(plane, NOT_READY, taints=[], ready=False, images=[["docker.io/swe-smith/not-ready-only:openai"]])
    for name, pool, images in ((f"{PAIR}-a", PAIR, [["docker.io/swe-smith/pair-one:openai"]]),
                               (f"{PAIR}-b", PAIR, [[PAUSE]]),
                               # no agent, its kubelet's status at the cap
                               (STALE, STALE, [[smith(f"stale-filler-{i:02d}")] for i in range(MAX_IMAGES)])):
        create_node(plane, name, labels={POOL_KEY: pool},
                    taints=[{"key": POOL_KEY, "value": pool, "effect": "NoSchedule"}], images=images)

    # The chart comes first: it holds the NodeImages CRD the worker's agent publishes to.
    by_name = {}
    if "image-preflight" in chosen:
        by_name["image-preflight"] = setups.image_preflight(plane, folder / "image-preflight", stoppers)
    else:  # the agent still lists the worker's runtime, from which its status is made
        apply_service_accounts(plane)
    agent = setups.agent(plane, worker.name, worker.endpoint, folder, stoppers)
    if "image-preflight" in by_name:  # its CPU and RSS are image-preflight's with serve's
        by_name["image-preflight"].pids.append(agent)
    published = wait_for(lambda: setups.published(plane, worker.name), "the worker's NodeImages", timeout_s=60)
    if worker.real is None:
        plane.core().patch_node_status(worker.name, {"status": {"images": kubelet_status_images(published)}})
    else:
        wait_for(lambda: len(names := worker.real.status_names()) == MAX_IMAGES
                 and any(smith("held") in image for image in names),
                 "the kubelet posts the worker's images", timeout_s=120, interval_s=1.0)
    if args.fleet:
        add_fleet(plane, args.fleet, [image.names for image in plane.core().read_node(worker.name).status.images])
    listed = [name for node in plane.core().list_node().items for image in node.status.images or ()
              for name in image.names or ()]

    template_job = build_job_spec(TEMPLATE.read_text(), example_row(ROW), rollout_id="side-by-side", namespace=None)
    all_cases = cases(digest)
    for name in chosen:
        if name == "none":
            by_name[name] = setups.no_policy(plane)
        elif name == "cel":
            by_name[name] = setups.cel(plane, listed)
        elif name == "cel-best":
            try:
                by_name[name] = setups.cel_best(plane)
            except setups.NotRunnable as exc:
                print(f"{name}: not run: {exc}", flush=True)
    for peer_of, setup in (("gatekeeper", setups.gatekeeper), ("kyverno", setups.kyverno)):
        if shapes := [name for name in chosen if program(name) == peer_of]:
            by_name.update((peer.name, peer) for peer in setup(plane, binaries, folder / peer_of, stoppers, shapes))
    peers = [by_name[name] for name in PEERS if name in by_name]

    batch = k8s.BatchV1Api(plane.api_client())
    held, absent = all_cases[0], all_cases[1]
    for peer in list(peers):
        if peer.name == "none":
            continue
        try:
            wait_for(lambda: answer_of(batch, peer.namespace, absent, template_job, worker.name) is False
                     and answer_of(batch, peer.namespace, held, template_job, worker.name) is True,
                     f"{peer.name} decides", timeout_s=setups.READY_S, interval_s=1.0)
        except AssertionError as exc:
            # A peer that never tells the held image from the absent one is left out of the tables
            # and said to be, with its last answer to each (a fleet may be more than it can read).
            answers = [answer_of(batch, peer.namespace, case, template_job, worker.name) for case in (held, absent)]
            print(f"{peer.name}: not run: {exc}; it answered the held image {answers[0]!r}, the absent one "
                  f"{answers[1]!r}", flush=True)
            peers.remove(peer)

    fates = observe_on_node(plane, worker, all_cases, template_job) if worker.real else None
    print_decisions(batch, peers, all_cases, template_job, fates, worker.name)

    def fresh_job() -> dict:
        """A Job of an image no node holds and no request named before: every decision made anew."""
        return rollout_job(replace(absent, image=f"swe-smith/fresh-{uuid.uuid4().hex[:12]}:openai"), template_job)

    print_latency(plane, receiver, peers, fresh_job, args)
    return 0


def print_decisions(batch, peers, all_cases: list[Case], template_job: dict, fates: list[str] | None,
                    worker: str) -> None:
    """Each policy's answer to each case, marked against the right answer."""
    judged = [p for p in peers if p.name != "none"]
    answers = {peer.name: [answer_of(batch, peer.namespace, case, template_job, worker) for case in all_cases]
               for peer in judged}
    print(f"\n## Decisions on {len(all_cases)} rollout Jobs (✓ right, ✗ wrong)\n")
    seen = " on the real node |" if fates else ""
    print(f"| Job | the kubelet |{seen} right answer | " + " | ".join(p.name for p in judged) + " |")
    print("|---|---|" + ("---|" if fates else "") + "---|" + "---|" * len(judged))
    for index, case in enumerate(all_cases):
        marks = []
        for peer in judged:
            answer = answers[peer.name][index]
            word = "admit" if answer is True else "deny" if answer is False else str(answer)
            marks.append(f"{'✓' if answer is case.admit else '✗'} {word}")
        on_node = f" {fates[index]} |" if fates else ""
        print(f"| {case.name} | {case.why} |{on_node} {'admit' if case.admit else 'deny'} | "
              + " | ".join(marks) + " |")
    print("| **right** | |" + (" |" if fates else "") + " | " + " | ".join(
        f"**{sum(a is c.admit for a, c in zip(answers[p.name], all_cases))}/{len(all_cases)}**" for p in judged) + " |")



NAN = float("nan")
TIMES = ("client p50", "client p99", "Create p50", "Create p99", "webhook p50", "webhook p99", "webhook max")


def phase_figures(plane, receiver: SpanReceiver, peers, new_job: Callable[[], dict], rate: float | None,
                  args) -> tuple[dict[str, dict[str, float]], float]:
    """One phase: by peer its creations, their times (s), webhook calls, CPU s and RSS MiB; and
    the apiserver's CPU s."""
    time.sleep(6)  # the apiserver exports spans every 5 s: the last phase's are in
    receiver.clear()
    procs = {peer.name: peer.pids for peer in peers}
    apiserver = [plane.apiserver.popen.pid]
    cpu_before = {name: tree_cpu_seconds(pids) for name, pids in procs.items()}
    apiserver_before = tree_cpu_seconds(apiserver)
    latencies = run_phase(plane, peers, new_job, args.seconds, rate=rate, clients=args.clients)
    cpu = {name: tree_cpu_seconds(pids) - cpu_before[name] for name, pids in procs.items()}
    apiserver_cpu = tree_cpu_seconds(apiserver) - apiserver_before
    time.sleep(6)
    figures = {}
    for peer in peers:
        values = latencies[peer.name]
        creates, calls = span_seconds(receiver, peer)
        figures[peer.name] = {
            "creations": len(values), "client p50": percentile(values, .5), "client p99": percentile(values, .99),
            "Create p50": percentile(creates, .5), "Create p99": percentile(creates, .99),
            "webhook calls": len(calls) if peer.webhook else NAN,
            "webhook p50": percentile(calls, .5) if peer.webhook else NAN,
            "webhook p99": percentile(calls, .99) if peer.webhook else NAN,
            "webhook max": max(calls, default=NAN) if peer.webhook else NAN,
            "CPU s": cpu[peer.name] if peer.pids else NAN,
            "RSS MiB": tree_rss_mib(peer.pids) if peer.pids else NAN}
    return figures, apiserver_cpu


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """The median of the runs, and their range when there are several."""
    values = [v * scale for v in values if v == v]
    if not values:
        return "–"
    median = f"{statistics.median(values):.{digits}f}"
    return median if len(values) == 1 else f"{median} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def print_latency(plane, receiver: SpanReceiver, peers, new_job: Callable[[], dict], args) -> None:
    """The two phases of creating `new_job()`s, the peers interleaved, each run --runs times."""
    for title, rate in ((f"fixed rate, {args.rate:g} creations/s in all", args.rate),
                        (f"saturation, {args.clients} clients", None)):
        runs = [phase_figures(plane, receiver, peers, new_job, rate, args) for _ in range(args.runs)]
        print(f"\n## Latency, {title}, {args.seconds:g} s, {args.runs} runs\n")
        print("ms, the median of the runs (their range); Create and webhook: the apiserver's spans of the "
              "request and of its webhook call, the calls counted over all runs; CPU s and RSS: the "
              "policy's own processes, one for both shapes of Gatekeeper and of Kyverno (the apiserver "
              f"used {spread([cpu for _, cpu in runs])} CPU s); ÷: ratios of client p50s.\n")
        print("| policy | creations | " + " | ".join(TIMES[:4]) + " | webhook calls | " + " | ".join(TIMES[4:])
              + " | CPU s | RSS MiB | p50 ÷ CEL | p50 ÷ none |")
        print("|---" * 14 + "|")
        for peer in peers:
            by_run = [figures[peer.name] for figures, _ in runs]
            cells = [peer.name, str(sum(f["creations"] for f in by_run))]
            cells += [spread([f[name] for f in by_run], 1000) for name in TIMES[:4]]
            cells.append(str(sum(f["webhook calls"] for f in by_run)) if peer.webhook else "–")
            cells += [spread([f[name] for f in by_run], 1000) for name in TIMES[4:]]
            if peer.pids:
                cells += [spread([f["CPU s"] for f in by_run]), spread([f["RSS MiB"] for f in by_run], digits=0)]
            else:
                cells += ["in the apiserver" if peer.name.startswith("cel") else "–", "–"]
            for base in ("cel", "none"):
                ratios = [figures[peer.name]["client p50"] / figures[base]["client p50"]
                          for figures, _ in runs if base in figures]
                cells.append(spread(ratios, digits=2))
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
