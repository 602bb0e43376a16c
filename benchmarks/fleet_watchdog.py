"""The watchdog at fleet scale: `image-preflight watchdog` with --pods rollout Pods
Running in --namespaces opted-in namespaces, on --nodes KWOK nodes. Its RSS and CPU, and how soon
it still fails a stalled Job.

    export PATH="$(tests/controlplane/build | tail -n 1):$PATH"
    benchmarks/fleet/build                               # kwok, cached; found by this script too
    .venv/bin/python benchmarks/fleet_watchdog.py        # --nodes 200 --namespaces 100 --pods 20000
                                                         # [--pods-per-job 1] [--grace 3] [--repeat 3]
                                                         # [--steady 60] [--during-rollout] [--json FILE]

1. benchmarks/fleet.py's control plane (tests/controlplane/cluster.py, the apiserver's own
   compaction off) and KWOK keeping --nodes fake Nodes Ready; the chart's ServiceAccounts, roles
   and the watchdog's write policy. KWOK runs with benchmarks/fleet/build's stages less
   pod-complete, which would end every Job's Pod the moment it runs: a rollout's Pod runs for
   minutes, so Running is what a fleet's watchdog lives with. The controller-manager and the
   scheduler get a larger client QPS than their defaults (20 and 50), or creating the fleet would
   take most of an hour; the watchdog's own client is as the chart runs it.
2. --namespaces namespaces labelled as the chart opts them in (image-preflight.io/enforce=true),
   and in them --pods / --pods-per-job Jobs shaped as agent-lightning's (tests/builders/stalls.py
   job_manifest, parallelism = completions = --pods-per-job); the Job controller makes their Pods,
   the scheduler places them, kwok's pod-ready stage makes them Running. Waited for (bounded by
   --running-deadline).
3. The watchdog started as the chart's Deployment runs it (its args rendered from the chart, its
   ServiceAccount's token, --write-policy), --grace from here, once every Pod runs. Startup: from
   its start to /metrics answering (its readiness probe), and to its first list of the Pods done
   (its Pod watch opened, from the audit log's ResponseStarted), with the CPU seconds it spent
   until then and its RSS. Steady, --settle seconds later: the CPU it spends over --steady
   seconds, as CPU seconds per minute, its RSS and its peak RSS (VmHWM). A Running Pod leaves
   nothing in its memory (core/watchdog/stalls.py keeps only Pods that wait, bound ones until
   their sandbox is up among them), so these need not grow with --pods. With --during-rollout it
   starts before the Jobs instead (its startup is then that of an empty fleet) and sees every Pod
   created, bound and run: its CPU over that wave and its peak RSS are what the churn costs it.
4. --repeat times: a Job in the first namespace whose Pod lands on a node kwok does not manage
   (create_node, tainted so that only this Pod goes there), its waiting status written as the
   kubelet writes it (ErrImageNeverPull, imagePullPolicy Never); the time from that write to the
   Job's Failed condition, read every 0.1 s, against the bound grace + 2 s. That node's "kubelet"
   (tests/cluster/watchdog_process.py FakeKubelet, here for that node only) ends the Pod the Job
   controller deletes, without which the Job controller does not set Failed.

Bounded: every wait has a deadline. Everything listens on 127.0.0.1 and is stopped and removed at
the end. Prints a table; --json FILE writes the figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from kubernetes import client as k8s

from benchmarks.figures import hwm_mib, rss_mib, tree_cpu_seconds
from benchmarks.fleet import FleetControlPlane, create_nodes, kwok_folder, start_kwok, wait_count, wait_ready
from image_preflight.core.watchdog import job_failure
from tests.builders.stalls import ENFORCE_LABEL, failed_condition, job_manifest
from tests.chart import API_ONLY, apply, render
from tests.cluster.watchdog_process import FakeKubelet
from tests.controlplane.cluster import (
    PARKED,
    create_node,
    free_port,
    renew_lease,
    require_control_plane,
    terminate,
    wait_for,
)

WATCHDOG_NAMESPACE = "image-preflight"
WATCHDOG_ACCOUNT = "image-preflight-watchdog"
IMAGE = "swe-smith/task-fleet.0001:openai"
STALL_NODE = "stall-node"
STALL_IMAGE = "swe-smith/task-stall.0001:openai"
# Asks the apiserver for metadata only: counting 20,000 Pods need not move their specs.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
CLIENT_QPS = ("--kube-api-qps=300", "--kube-api-burst=600")
SERVICE_ACCOUNTS_DEADLINE_S = 120.0
WATCHDOG_READY_DEADLINE_S = 600.0
STALL_DEADLINE_S = 60.0


# --- the fleet ------------------------------------------------------------------------------------

def running_stages(kwok: Path, work: Path) -> Path:
    """A folder as benchmarks/fleet/build makes one (kwok and stages.yaml), less the pod-complete
    Stage, for benchmarks.fleet.start_kwok."""
    folder = work / "kwok-running"
    folder.mkdir()
    (folder / "kwok").symlink_to(kwok / "kwok")
    stages = [s for s in yaml.safe_load_all((kwok / "stages.yaml").read_text())
              if s and s["metadata"]["name"] != "pod-complete"]
    (folder / "stages.yaml").write_text(yaml.safe_dump_all(stages))
    return folder


def namespace_name(index: int) -> str:
    return f"rollouts-{index:03d}"


def create_namespaces(core: k8s.CoreV1Api, count: int) -> None:
    for index in range(count):
        core.create_namespace({"metadata": {"name": namespace_name(index), "labels": ENFORCE_LABEL}})
    # Admission refuses Pods until the controller-manager has made a namespace's default
    # ServiceAccount; the Job controller's FailedCreate Events would then be the watchdog's too.
    wait_for(lambda: all(core.list_namespaced_service_account(namespace_name(i), _request_timeout=10).items
                         for i in range(count)), "every namespace's default ServiceAccount",
             timeout_s=SERVICE_ACCOUNTS_DEADLINE_S, interval_s=1.0)


def create_jobs(batch: k8s.BatchV1Api, namespaces: int, jobs: int, pods_per_job: int, workers: int) -> None:
    def create(index: int) -> None:
        manifest = job_manifest(f"agl-rollout-{index:05d}", IMAGE, parallelism=pods_per_job)
        batch.create_namespaced_job(namespace_name(index % namespaces), manifest, _request_timeout=60)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, range(jobs)))


def count_pods(api: k8s.ApiClient, field_selector: str) -> int:
    """Pods across all namespaces matching `field_selector`, listed as metadata in pages."""
    count, token = 0, None
    while True:
        answer = k8s.CoreV1Api(api).list_pod_for_all_namespaces(
            field_selector=field_selector, limit=5000, _continue=token, _headers={"Accept": METADATA_ONLY},
            _preload_content=False, _request_timeout=120)
        body = json.loads(answer.data)
        count += len(body["items"])
        token = body["metadata"].get("continue")
        if not token:
            return count


class StallNode:
    """A node kwok does not manage, its Lease renewed here as its kubelet would, tainted PARKED so
    that only the stall Jobs' Pods (which tolerate it) land there; and its kubelet's part in
    ending a deleted Pod (FakeKubelet, for this node's Pods only)."""

    def __init__(self, plane) -> None:
        self.plane = plane
        self.uid = create_node(plane, STALL_NODE)["metadata"]["uid"]
        self._stop = threading.Event()
        self._lease = threading.Thread(target=self._renew, name="stall-node-lease", daemon=True)
        self._lease.start()
        self.kubelet = NodeKubelet(plane, STALL_NODE).start()

    def _renew(self) -> None:
        coordination = k8s.CoordinationV1Api(self.plane.api_client())
        while not self._stop.wait(5.0):
            try:
                renew_lease(coordination, STALL_NODE, self.uid)
            except Exception:  # noqa: BLE001 - a busy apiserver; the next renewal comes 5 s later
                pass

    def stop(self) -> None:
        self._stop.set()
        self.kubelet.stop()


class NodeKubelet(FakeKubelet):
    """FakeKubelet for the Pods bound to one node, found as the kubelet finds them (spec.nodeName)."""

    def __init__(self, plane, node: str) -> None:
        super().__init__(plane)
        self.node = node

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                for pod in self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items:
                    if pod.metadata.deletion_timestamp is not None:
                        self._terminate(pod)
            except Exception:  # noqa: BLE001 - gone meanwhile, or a busy apiserver; the next round sees
                pass


def stall(plane, batch: k8s.BatchV1Api, namespace: str, name: str, grace_s: float) -> float:
    """A Job whose Pod waits with ErrImageNeverPull on the stall node: seconds from the waiting
    status written to the Job's Failed condition read."""
    core = plane.core()
    manifest = job_manifest(name, STALL_IMAGE)
    pod_spec = manifest["spec"]["template"]["spec"]
    pod_spec["containers"][0]["imagePullPolicy"] = "Never"
    pod_spec["nodeSelector"] = {"kubernetes.io/hostname": STALL_NODE}
    pod_spec["tolerations"] = [{"key": PARKED["key"], "operator": "Equal", "value": PARKED["value"],
                                "effect": PARKED["effect"]}]
    batch.create_namespaced_job(namespace, manifest)
    (pod,) = wait_for(lambda: [p for p in core.list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={name}").items if p.spec.node_name],
        f"the Pod of {name} is bound", timeout_s=STALL_DEADLINE_S)
    container = pod.spec.containers[0]
    # As tests/cluster/test_cluster_watchdog.py wait_status writes it (the kubelet's status manager).
    waiting = {"reason": "ErrImageNeverPull",
               "message": f'Container image "{container.image}" is not present with pull policy of Never'}
    start = time.monotonic()
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
        "phase": "Pending", "containerStatuses": [{
            "name": container.name, "image": container.image, "imageID": "", "ready": False, "restartCount": 0,
            "started": False, "state": {"waiting": waiting}}]}})
    wait_for(lambda: failed_condition(core.api_client.sanitize_for_serialization(
        batch.read_namespaced_job(name, namespace))), f"Job {name} Failed", timeout_s=grace_s + STALL_DEADLINE_S)
    elapsed = time.monotonic() - start
    job = batch.read_namespaced_job(name, namespace)
    if json.loads(job.metadata.annotations[job_failure.ANNOTATION])["action"] != "failed":
        raise RuntimeError(f"Job {name} Failed, but not by the watchdog")
    return elapsed


# --- the watchdog ---------------------------------------------------------------------------------

def chart_args(grace_s: float, metrics_port: int) -> list[str]:
    """The watchdog's args as the chart's Deployment renders them, with this run's grace and port."""
    (deployment,) = [o for o in render(API_ONLY, hooks=False)
                     if o["kind"] == "Deployment" and o["metadata"]["name"] == WATCHDOG_ACCOUNT]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    replaced = {"--grace": f"--grace={grace_s:g}", "--metrics-port": f"--metrics-port={metrics_port}"}
    return [replaced.get(arg.split("=", 1)[0], arg) for arg in args]


def metrics_answer(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def pod_watch_opened(audit_log: Path, account: str) -> float | None:
    """When the watchdog's Pod watch opened (its first list of Pods done): the wall-clock time of
    the audit log's first ResponseStarted of a watch of pods by `account`."""
    user = f"system:serviceaccount:{WATCHDOG_NAMESPACE}:{account}"
    if not audit_log.exists():
        return None
    with audit_log.open(errors="replace") as lines:
        for line in lines:
            if '"watch"' not in line or '"pods"' not in line:
                continue
            event = json.loads(line)
            if (event["verb"] == "watch" and event["stage"] == "ResponseStarted"
                    and event["user"]["username"] == user and event.get("objectRef", {}).get("resource") == "pods"):
                return dt.datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()
    return None


# --- the run --------------------------------------------------------------------------------------

class ChartWatchdog:
    """`image-preflight watchdog` as a process, started as the chart runs it."""

    def __init__(self, plane, work: Path, grace_s: float) -> None:
        self.plane, self.log, self.port = plane, work / "watchdog.log", free_port()
        kubeconfig = plane.service_account_kubeconfig(WATCHDOG_NAMESPACE, WATCHDOG_ACCOUNT,
                                                      work / "watchdog.kubeconfig")
        self.args = [*chart_args(grace_s, self.port), f"--kubeconfig={kubeconfig}", "--host=127.0.0.1"]
        self.popen: subprocess.Popen | None = None

    def start(self) -> dict:
        """Start it; its startup figures once its first list of the Pods is done."""
        with open(self.log, "ab") as out:
            started_at, start = time.time(), time.monotonic()
            self.popen = subprocess.Popen([sys.executable, "-m", "image_preflight", *self.args], stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env={**os.environ, "POD_NAME": "image-preflight-watchdog-bench"})
        wait_for(lambda: self.check_alive() or metrics_answer(self.port), "the watchdog's /metrics",
                 timeout_s=WATCHDOG_READY_DEADLINE_S)
        ready_s = time.monotonic() - start
        opened = wait_for(lambda: self.check_alive() or pod_watch_opened(self.plane.audit_log, WATCHDOG_ACCOUNT),
                          "the watchdog's Pod watch", timeout_s=WATCHDOG_READY_DEADLINE_S, interval_s=0.5)
        return {"ready_s": ready_s, "first_list_s": opened - started_at, "startup_cpu_s": self.cpu_s(),
                "rss_after_list_mib": self.rss_mib()}

    def check_alive(self) -> None:
        if self.popen.poll() is not None:  # type: ignore[union-attr]  # started: popen is set
            raise RuntimeError(f"watchdog exited with {self.popen.returncode}:\n"  # type: ignore[union-attr]  # started: popen is set
                               f"{self.log.read_text(errors='replace')[-3000:]}")

    def cpu_s(self) -> float:
        return tree_cpu_seconds([self.popen.pid])  # type: ignore[union-attr]  # started: popen is set

    def rss_mib(self) -> float:
        return rss_mib(self.popen.pid)  # type: ignore[union-attr]  # started: popen is set

    def peak_rss_mib(self) -> float:
        return hwm_mib(self.popen.pid)  # type: ignore[union-attr]  # started: popen is set

    def stop(self) -> None:
        terminate(self.popen)


def run(args: argparse.Namespace, work: Path) -> dict:
    kwok, why = kwok_folder()
    if kwok is None:
        raise SystemExit(f"kwok is needed: {why}")
    plane = FleetControlPlane(work / "cp", lease_heartbeat=False)
    plane.controller_manager.args += [*CLIENT_QPS, "--concurrent-job-syncs=20"]
    plane.scheduler.args += list(CLIENT_QPS)
    jobs = args.pods // args.pods_per_job
    result: dict = {"nodes": args.nodes, "namespaces": args.namespaces, "pods": jobs * args.pods_per_job,
                    "jobs": jobs, "pods_per_job": args.pods_per_job, "grace_s": args.grace,
                    "during_rollout": args.during_rollout}
    kwok_process = watchdog = stall_node = None
    began = time.monotonic()
    try:
        plane.start()
        apply(plane, API_ONLY, kinds=("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                      "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
              watchdog_policy=True)
        kwok_process = start_kwok(plane, running_stages(kwok, work), work)
        alive = [*plane.processes, kwok_process]
        core, batch = plane.core(), k8s.BatchV1Api(plane.core().api_client)
        start = time.monotonic()
        create_nodes(plane, range(args.nodes), kwok=True, workers=8)
        wait_ready(plane, args.nodes, 120.0, alive)
        stall_node = StallNode(plane)
        create_namespaces(core, args.namespaces)
        result["fleet_nodes_s"] = time.monotonic() - start
        watchdog = ChartWatchdog(plane, work, args.grace)
        result["watchdog_args"] = watchdog.args
        if args.during_rollout:
            result.update(watchdog.start())
            cpu = watchdog.cpu_s()
        start = time.monotonic()
        create_jobs(batch, args.namespaces, jobs, args.pods_per_job, args.workers)
        result["jobs_created_s"] = time.monotonic() - start
        result["pods_running_s"] = wait_count(lambda: count_pods(core.api_client, "status.phase=Running"),
                                              result["pods"], "Pods Running", args.running_deadline,
                                              [*alive, *([watchdog] if args.during_rollout else [])], interval_s=5.0)
        print(f"{result['pods']:,} Pods Running {time.monotonic() - began:.0f} s into the run", file=sys.stderr)
        if args.during_rollout:
            result["rollout_cpu_s"] = watchdog.cpu_s() - cpu
            result["rollout_peak_rss_mib"] = watchdog.peak_rss_mib()
        else:
            result.update(watchdog.start())

        time.sleep(args.settle)  # the list's last page handed to the sink, the first watch events seen
        cpu, start = watchdog.cpu_s(), time.monotonic()
        time.sleep(args.steady)
        watchdog.check_alive()
        result["steady_cpu_s_per_min"] = (watchdog.cpu_s() - cpu) * 60 / (time.monotonic() - start)
        result["steady_rss_mib"] = watchdog.rss_mib()
        result["peak_rss_mib"] = watchdog.peak_rss_mib()

        result["stall_to_failed_s"] = [stall(plane, batch, namespace_name(0), f"agl-rollout-stall-{i}", args.grace)
                                       for i in range(args.repeat)]
        result["rss_after_stalls_mib"] = watchdog.rss_mib()
        result["cpu_total_s"] = watchdog.cpu_s()
        result["apiserver_rss_mib"] = rss_mib(plane.apiserver.popen.pid)  # type: ignore[union-attr]  # started: popen is set
        result["wall_s"] = time.monotonic() - began
    finally:
        if watchdog is not None:
            watchdog.stop()
        if stall_node is not None:
            stall_node.stop()
        if kwok_process is not None:
            kwok_process.stop()
        plane.stop()
    return result


def report(result: dict) -> str:
    bound = result["grace_s"] + 2.0
    times = result["stall_to_failed_s"]
    started = "before the Jobs" if result["during_rollout"] else "once every Pod ran"
    lines = [
        f"{result['jobs']:,} Jobs x {result['pods_per_job']} Pods on {result['nodes']} kwok nodes: created in "
        f"{result['jobs_created_s']:.0f} s, all Running {result['pods_running_s']:.0f} s later",
        f"the watchdog started {started}, as the chart runs it (--grace {result['grace_s']:g})",
        "",
        "| figure | value |",
        "|---|---|",
        f"| Pods Running, watched | {result['pods']:,} |",
        f"| opted-in namespaces | {result['namespaces']} |",
        f"| watchdog start to /metrics (readiness) | {result['ready_s']:.1f} s |",
        f"| watchdog start to its Pod watch open (first list done) | {result['first_list_s']:.1f} s |",
        f"| CPU until then (startup) | {result['startup_cpu_s']:.1f} s |",
        f"| RSS after the first list | {result['rss_after_list_mib']:.0f} MiB |",
    ]
    if result["during_rollout"]:
        lines.append(f"| CPU while the Pods were created and ran | {result['rollout_cpu_s']:.1f} s |")
    lines += [
        f"| RSS steady / peak (VmHWM) | {result['steady_rss_mib']:.0f} / {result['peak_rss_mib']:.0f} MiB |",
        f"| CPU steady | {result['steady_cpu_s_per_min']:.2f} s per minute |",
        f"| stall to Failed, median / max of {len(times)} | {statistics.median(times):.2f} / {max(times):.2f} s "
        f"(bound {bound:g} s: {'met' if max(times) <= bound else 'MISSED'}) |",
        f"| RSS after the stalls | {result['rss_after_stalls_mib']:.0f} MiB |",
        "",
        f"kube-apiserver RSS {result['apiserver_rss_mib']:,.0f} MiB; run {result['wall_s'] / 60:.1f} min",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--pods-per-job", type=int, default=1, help="each Job's parallelism and completions")
    parser.add_argument("--grace", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3, help="stalled Jobs, one after another")
    parser.add_argument("--during-rollout", action="store_true",
                        help="start the watchdog before the Jobs, so that it sees every Pod created and run")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after the first list before --steady")
    parser.add_argument("--steady", type=float, default=60.0, help="seconds the steady CPU is measured over")
    parser.add_argument("--workers", type=int, default=16, help="Jobs created at once")
    parser.add_argument("--running-deadline", type=float, default=1200.0)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if not (1 <= args.pods_per_job <= args.pods and 1 <= args.namespaces and 1 <= args.nodes <= 5000
            and args.repeat >= 1):
        parser.error("--pods-per-job 1..--pods, --namespaces >= 1, --nodes 1..5000, --repeat >= 1")
    require_control_plane()
    with tempfile.TemporaryDirectory(prefix="fleet-watchdog-") as tmp:
        result = run(args, Path(tmp))
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
