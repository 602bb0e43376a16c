"""What the faces cost at fleet size, for benchmarks/fleet.py: the webhook's call as the
apiserver times it, and the commands a user runs against the whole cluster.

- `Webhook`: `image-preflight serve` as the chart runs it (tests/controlplane/webhook.py's
  ServedWebhook, the chart's ValidatingWebhookConfiguration, its ServiceAccount's token), reached
  by the apiserver through the Service's ClusterIP as in a cluster.
- `job_spans`: rollout Jobs created at a fixed rate, each with one of a set of images, through the
  apiserver with dryRun=All (the webhook declares sideEffects: None, so the apiserver calls it;
  nothing is stored, so thousands of Jobs leave no Pods for the scheduler and kwok). They go in
  turns of three, each in an order drawn anew: one to the webhook's namespace, one to the
  reference's, and one to a namespace no webhook judges, so the apiserver's own time for a Job at
  the same moment stands beside the webhooks'. The figures are the apiserver's tracing spans
  (tests/controlplane/tracing.py): "Call validating webhook" for the webhook and "Create" for the
  request.
- `Reference`: a second serve, the same process with the same flags, deciding from a snapshot file
  of the first nodes' lists (--inventory) in place of the cluster's, behind a Service and a webhook
  configuration of its own for one more namespace. Its call is the webhook's call on 3 nodes at
  the same moments, under the same load: the fleet's control plane and kwok share this machine's
  CPUs with both, and slow the apiserver's side of every call, whoever answers it.
- `timed_command`: one CLI command as its own process, its wall time, CPU and peak RSS.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import sys
import time
import urllib.request
from pathlib import Path

from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.figures import hwm_mib, percentile
from benchmarks.peer_setups import IMAGE_PREFLIGHT_WEBHOOK
from tests.builders.stalls import ENFORCE_LABEL
from tests.chart import API_ONLY, apply, merged, secret_values
from tests.controlplane.cluster import ControlPlane, new_namespace
from tests.controlplane.tracing import WEBHOOK_SPAN, SpanReceiver
from tests.controlplane.webhook import NAMESPACE, SERVICE, ServedWebhook

JUDGED_NAMESPACE, UNJUDGED_NAMESPACE = "fleet-rollouts", "fleet-unjudged"
REFERENCE_NAMESPACE, REFERENCE_SERVICE = "fleet-reference", "image-preflight-reference"
REFERENCE_LABEL = {"image-preflight.io/fleet-reference": "true"}
REFERENCE_WEBHOOK = "reference.image-preflight.io"
TURNS = (JUDGED_NAMESPACE, REFERENCE_NAMESPACE, UNJUDGED_NAMESPACE)  # where job_spans sends each Job in turn
QUANTILES = (0.5, 0.9, 0.99)
# As benchmarks/fleet.py's serve ran before: the chart's defaults for a training cluster.
SERVE_ARGS = ("--tls-min-version=1.3", "--mode=enforce", "--unknown=allow", "--require=all", "--max-images=50",
              "--log-level=warning")
EXPORT_S = 6.0  # the apiserver exports its spans every 5 s
OUTPUT_LINES = 20  # a command's first lines kept with its figures


class Webhook:
    """The chart's webhook objects applied once; `serve()` starts a ServedWebhook against them."""

    def __init__(self, plane: ControlPlane, work: Path) -> None:
        from image_preflight.cli import main as cli

        self.plane, self.work = plane, work
        self.certs = work / "certs"
        if cli(["certs", "--service", SERVICE, "--namespace", NAMESPACE,
                "--out-dir", str(self.certs)]):
            raise RuntimeError("image-preflight certs failed")
        apply(plane, merged(API_ONLY, secret_values(self.certs)), workloads=False)
        self.kubeconfig = plane.service_account_kubeconfig(NAMESPACE, "image-preflight",
                                                           work / "serve.kubeconfig")
        new_namespace(plane, ENFORCE_LABEL, name=JUDGED_NAMESPACE)
        new_namespace(plane, name=UNJUDGED_NAMESPACE)
        self.served = 0

    def serve(self) -> ServedWebhook:
        """A ServedWebhook, not started."""
        self.served += 1
        return ServedWebhook(self.plane, self.certs, self.kubeconfig, self.work / f"serve-{self.served}.log",
                             *SERVE_ARGS)


class Reference:
    """The chart's Service and ValidatingWebhookConfiguration again, under other names, with
    certificates of their own, judging REFERENCE_NAMESPACE alone; `serve(snapshot)` starts a
    ServedWebhook behind them that decides from the snapshot file."""

    def __init__(self, plane: ControlPlane, work: Path) -> None:
        from image_preflight.cli import main as cli

        self.plane, self.work = plane, work
        self.certs = work / "reference-certs"
        if cli(["certs", "--service", REFERENCE_SERVICE, "--namespace", NAMESPACE, "--out-dir", str(self.certs)]):
            raise RuntimeError("image-preflight certs failed")
        core = plane.core()
        chart = core.read_namespaced_service(SERVICE, NAMESPACE)
        core.create_namespaced_service(NAMESPACE, {"metadata": {"name": REFERENCE_SERVICE}, "spec": {
            "ports": [{"name": port.name, "port": port.port, "targetPort": port.target_port}
                      for port in chart.spec.ports]}})
        admission = k8s.AdmissionregistrationV1Api(core.api_client)
        configuration = json.loads(admission.read_validating_webhook_configuration(
            SERVICE, _preload_content=False).data)
        (webhook,) = configuration["webhooks"]
        webhook["name"] = REFERENCE_WEBHOOK
        webhook["clientConfig"]["service"]["name"] = REFERENCE_SERVICE
        webhook["clientConfig"]["caBundle"] = base64.b64encode((self.certs / "ca.crt").read_bytes()).decode()
        webhook["namespaceSelector"] = {"matchLabels": REFERENCE_LABEL}
        admission.create_validating_webhook_configuration(
            {"metadata": {"name": REFERENCE_SERVICE}, "webhooks": [webhook]})
        new_namespace(plane, REFERENCE_LABEL, name=REFERENCE_NAMESPACE)
        self.served = 0

    def serve(self, snapshot: Path) -> ServedWebhook:
        """A ServedWebhook deciding from `snapshot`, not started."""
        self.served += 1
        return ServedWebhook(self.plane, self.certs, None, self.work / f"reference-{self.served}.log",
                             *SERVE_ARGS, "--inventory", str(snapshot), service=REFERENCE_SERVICE)


def rollout_job(name: str, image: str) -> dict:
    """A rollout Job as agent-lightning's SWE-smith template makes it, reduced to what is decided."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "rollout", "image": image, "imagePullPolicy": "IfNotPresent"}]}}}}


def job_spans(plane: ControlPlane, receiver: SpanReceiver, served: ServedWebhook, reference: ServedWebhook,
              images: list[str], *, seconds: float, rate: float, label: str) -> dict:
    """Jobs created with dryRun=All at `rate` a second for `seconds`, in turns of one each in the
    judged, the reference's and the unjudged namespace, each turn with the next of `images`; the
    spans of this phase's requests, and the time `served` and `reference` themselves took to answer
    (their /metrics), to tell their part of a call from the rest."""
    batch = k8s.BatchV1Api(plane.core().api_client)
    since_ns = time.time_ns()
    answered_before, published_before = answering(served), publications(served)
    reference_before = answering(reference)
    answers = {"admitted": 0, "denied": 0, "failed": 0}
    count = int(seconds * rate)
    # Each turn in its own order: a process that wakes at some period (a heartbeat, a sampler)
    # then delays no one of the three more often than the others.
    shuffled = random.Random(label)
    order: list[str] = []
    sent = dict.fromkeys(TURNS, 0)
    start = time.monotonic()
    for index in range(count):
        time.sleep(max(0.0, start + index / rate - time.monotonic()))
        if not order:
            order = shuffled.sample(TURNS, len(TURNS))
        namespace = order.pop()
        sent[namespace] += 1
        job = rollout_job(f"{label}-{index}", images[index // len(TURNS) % len(images)])
        try:
            batch.create_namespaced_job(namespace, job, dry_run="All", _request_timeout=30)
            outcome = "admitted"
        except k8s.ApiException as exc:
            outcome = "denied" if "denied the request" in str(exc.body or "") else "failed"
        answers[outcome] += 1
    answered = [after - before for after, before in zip(answering(served), answered_before)]
    reference_answered = [after - before for after, before in zip(answering(reference), reference_before)]
    published = {by: count - published_before.get(by, 0) for by, count in publications(served).items()}
    tainted = node_taints(plane)
    time.sleep(EXPORT_S)
    fresh = [span for span in receiver.spans() if span.start_ns >= since_ns]

    def calls_of(webhook: str) -> list[float]:
        return [span.seconds for span in fresh
                if span.name == WEBHOOK_SPAN and span.attributes.get("webhook", "").startswith(webhook)]

    calls, reference_calls = calls_of(IMAGE_PREFLIGHT_WEBHOOK), calls_of(REFERENCE_WEBHOOK)
    creates = {namespace: [span.seconds for span in fresh if span.name == "Create"
                           and span.attributes.get("resource") == "jobs"
                           and span.attributes.get("namespace") == namespace]
               for namespace in TURNS}
    return {"jobs": count, "rate": rate, "answers": answers,
            "calls": len(calls), "judged_jobs": sent[JUDGED_NAMESPACE],
            **quantiles("webhook", calls),
            "reference_calls": len(reference_calls), "reference_jobs": sent[REFERENCE_NAMESPACE],
            **quantiles("reference", reference_calls),
            **quantiles("create_judged", creates[JUDGED_NAMESPACE]),
            **quantiles("create_unjudged", creates[UNJUDGED_NAMESPACE]),
            "serve_answered": answered[0], "serve_mean_s": answered[1] / answered[0] if answered[0] else None,
            "reference_answered": reference_answered[0],
            "reference_mean_s": reference_answered[1] / reference_answered[0] if reference_answered[0] else None,
            "serve_publications": {by: count for by, count in published.items() if count},
            "node_taints_after": tainted}


def quantiles(name: str, seconds: list[float]) -> dict:
    """{name_p50_s, name_p90_s, name_p99_s} of `seconds`."""
    return {f"{name}_p{round(q * 100)}_s": percentile(seconds, q) for q in QUANTILES}


def node_taints(plane: ControlPlane) -> dict[str, int]:
    """How many nodes carry each taint (key:effect): the node lifecycle controller's NotReady and
    unreachable taints are what a Node's change that placements read is most likely to be."""
    answer = plane.core().list_node(_preload_content=False, _request_timeout=120)
    counts: dict[str, int] = {}
    for node in json.loads(answer.data)["items"]:
        for taint in node.get("spec", {}).get("taints") or ():
            key = f"{taint.get('key')}:{taint.get('effect')}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def served_metrics(served: ServedWebhook, name: str) -> list:
    """The samples of family `name` on `served`'s /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{served.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return family.samples
    raise RuntimeError(f"serve's /metrics has no {name}")


def answering(served: ServedWebhook) -> tuple[float, float]:
    """(reviews answered, seconds spent answering them) so far, from `served`'s /metrics."""
    name = "image_preflight_admission_duration_seconds"
    found = {sample.name: sample.value for sample in served_metrics(served, name)}
    return found[name + "_count"], found[name + "_sum"]


def publications(served: ServedWebhook) -> dict[str, float]:
    """The inventories `served` published so far, by what changed (each but a lease's forgets the
    decisions remembered)."""
    return {sample.labels["by"]: sample.value
            for sample in served_metrics(served, "image_preflight_inventory_publications")
            if sample.name.endswith("_total")}


def timed_command(argv: list[str], log: Path, timeout_s: float = 1800.0) -> dict:
    """`python -m image_preflight *argv` as a process: wall seconds, CPU seconds (wait4), peak RSS
    (its VmHWM, read every 20 ms until it exits: wait4's ru_maxrss would count the parent's memory
    it was forked from), exit code, its first lines and its last."""
    start = time.monotonic()
    # Spawned and reaped by hand, not by subprocess: wait4 gives this child's own CPU time.
    with open(log, "wb") as out:
        pid = os.posix_spawn(sys.executable, [sys.executable, "-m", "image_preflight", *argv], os.environ,
                             file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                           (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                                           (os.POSIX_SPAWN_DUP2, out.fileno(), 2)])
    peak = 0.0
    while True:
        reaped, status, usage = os.wait4(pid, os.WNOHANG)
        if reaped:
            break
        if time.monotonic() - start > timeout_s:
            os.kill(pid, signal.SIGKILL)
        try:
            peak = max(peak, hwm_mib(pid))
        except (OSError, ValueError):
            pass  # exited between the two calls: wait4 reaps it next
        time.sleep(0.02)
    lines = log.read_text(errors="replace").strip().splitlines()
    return {"wall_s": time.monotonic() - start, "peak_rss_mib": peak, "cpu_s": usage.ru_utime + usage.ru_stime,
            "exit": os.waitstatus_to_exitcode(status), "last_line": lines[-1][:300] if lines else "",
            "lines": [line[:300] for line in lines[:OUTPUT_LINES]]}
