"""`image-preflight watchdog` on the real control plane, with the real Job controller as the proof.

No kubelet runs here. The tests write a Pod's container status through the status subresource as
the kubelet does (pkg/kubelet/status/status_manager.go), and `FakeKubelet` finishes what the Job
controller starts: a Pod it deletes is set terminal and then removed with grace 0, as the kubelet's
status manager does once its containers are gone. The watchdog runs as a process with the
ServiceAccount and ClusterRole of the chart's watchdog; the webhook runs too, so every Job
and Pod here is admitted (or denied) as in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import threading
import time
import uuid
from pathlib import Path

import kr8s
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.core.watchdog import job_failure
from image_preflight.core.watchdog.stalls import Stalls
from image_preflight.kube.client import api_client
from image_preflight.watchdog.actions import Actions
from tests.builders.stalls import (
    DENIED_PREFIX,
    ENFORCE_LABEL,
    SANDBOX_MESSAGES,
    containerd_names,
    failed_condition,
    job_manifest,
    kubelet_event,
)
from tests.chart import render
from tests.cluster.watchdog_process import BOUND_S, GRACE_S, FakeKubelet, Watchdog
from tests.controlplane.cluster import create_node, delete_namespaces, new_namespace, set_node_images, wait_for
from tests.controlplane.webhook import ServedWebhook

ID = uuid.uuid4().hex[:8]
NODE = f"wd-cpu-{ID}"
HELD = f"swe-smith/task-watchdog.{ID}:openai"
LATER = f"swe-smith/task-watchdog-later.{ID}:openai"  # held, then collected
FIGURES: dict[str, float] = {}


class Cluster:
    def __init__(self, plane, watchdog: Watchdog, kubelet: FakeKubelet, kubeconfig: Path) -> None:
        self.plane, self.watchdog, self.kubelet, self.kubeconfig = plane, watchdog, kubelet, kubeconfig
        self.core = plane.core()
        self.batch = k8s.BatchV1Api(self.core.api_client)
        self.namespaces: list[str] = []

    def namespace(self, opted_in: bool = True) -> str:
        name = new_namespace(self.plane, ENFORCE_LABEL if opted_in else {})
        self.namespaces.append(name)
        self.kubelet.namespaces.append(name)
        return name

    def job(self, namespace: str, name: str, image: str, *, policy: str = "IfNotPresent", **spec) -> dict:
        manifest = job_manifest(name, image)
        manifest["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = policy
        manifest["spec"].update(spec)
        return self.batch.create_namespaced_job(namespace, manifest).to_dict()

    def bound_pod(self, namespace: str, job: str):
        (pod,) = wait_for(lambda: [p for p in self.core.list_namespaced_pod(
            namespace, label_selector=f"batch.kubernetes.io/job-name={job}").items if p.spec.node_name],
            f"the Pod of {job} is bound", timeout_s=60)
        return pod

    def read_job(self, namespace: str, name: str) -> dict:
        return self.core.api_client.sanitize_for_serialization(self.batch.read_namespaced_job(name, namespace))

    def events(self, namespace: str, kind: str, name: str) -> list:
        return self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}").items


def wait_status(core, pod, reason: str | None, message: str = "") -> None:
    """Post the container's state through the status subresource, as the kubelet does."""
    container = pod.spec.containers[0]
    state = {"waiting": {"reason": reason, "message": message}} if reason else {
        "running": {"startedAt": "2026-11-30T00:00:00Z"}}
    core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
        "phase": "Pending" if reason else "Running",
        "containerStatuses": [{"name": container.name, "image": container.image, "imageID": "", "ready": not reason,
                               "restartCount": 0, "started": not reason, "state": state}]}})


def never_pull_message(image: str) -> str:
    # pkg/kubelet/images/image_manager.go EnsureImageExists
    return f'Container image "{image}" is not present with pull policy of Never'


@pytest.fixture(scope="module")
def cluster(control_plane, deployed, tmp_path_factory):
    """The chart applied (the watchdog's ServiceAccount and role among its objects), `serve` and
    `watchdog` running with their ServiceAccounts, one untainted node holding HELD and LATER."""
    folder = tmp_path_factory.mktemp("watchdog")
    served = ServedWebhook(control_plane, deployed, control_plane.service_account_kubeconfig(
        "image-preflight", "image-preflight", folder / "serve.kubeconfig"), folder / "serve.log")
    kubeconfig = control_plane.service_account_kubeconfig("image-preflight", "image-preflight-watchdog",
                                                          folder / "watchdog.kubeconfig")
    watchdog = Watchdog(control_plane, kubeconfig, folder / "watchdog.log")
    kubelet = FakeKubelet(control_plane).start()
    state = Cluster(control_plane, watchdog, kubelet, kubeconfig)
    core = control_plane.core()
    try:
        create_node(control_plane, NODE, images=[containerd_names(HELD, "a"), containerd_names(LATER, "b")], taints=[])
        served.start()
        watchdog.start()
        yield state
    finally:
        watchdog.stop()
        served.stop()
        kubelet.stop()
        delete_namespaces(control_plane, state.namespaces)
        core.delete_node(NODE)
    if path := os.environ.get("IMAGE_PREFLIGHT_FIGURES"):
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(FIGURES) + "\n")


def _kr8s_wait_failed(plane, namespace: str, name: str, timeout_s: float) -> tuple[dict | None, float]:
    """Watch Jobs as agent-lightning's controller does (k8s_reconciler.py, _watch_jobs_loop and
    _handle_job_event); the Failed condition and when it was seen."""
    async def watch() -> tuple[dict | None, float]:
        api = await kr8s.asyncio.api(kubeconfig=str(plane.kubeconfig))
        events = kr8s.asyncio.watch("jobs", namespace=namespace,
                                    label_selector="app.kubernetes.io/managed-by=agentlightning", api=api)
        async with contextlib.aclosing(events):
            async for _, obj in events:
                if obj.name == name and (condition := failed_condition(obj.raw)):
                    return condition, time.monotonic()
        return None, time.monotonic()

    return asyncio.run(asyncio.wait_for(watch(), timeout_s))


class _Seen(threading.Thread):
    def __init__(self, plane, namespace: str, name: str) -> None:
        super().__init__(daemon=True)
        self.args_ = (plane, namespace, name)
        self.result: tuple[dict | None, float] | None = None

    def run(self) -> None:
        self.result = _kr8s_wait_failed(*self.args_, timeout_s=BOUND_S + 30)


def _fails_and_kr8s_sees_it(cluster, namespace: str, name: str, pod, reason: str, message: str) -> tuple[dict, float]:
    seen = _Seen(cluster.plane, namespace, name)
    seen.start()
    time.sleep(1.0)  # the watch is open before the status is written
    start = time.monotonic()
    wait_status(cluster.core, pod, reason, message)
    seen.join()
    condition, at = seen.result
    assert condition is not None, cluster.watchdog.tail()
    return condition, at - start


def test_a_job_whose_pod_waits_with_err_image_never_pull_fails_and_kr8s_sees_it(cluster):
    namespace = cluster.namespace()
    cluster.job(namespace, "never-pull", HELD, policy="Never")
    pod = cluster.bound_pod(namespace, "never-pull")

    condition, elapsed = _fails_and_kr8s_sees_it(cluster, namespace, "never-pull", pod, "ErrImageNeverPull",
                                                 never_pull_message(HELD))
    FIGURES["first waiting status to Failed (grace 3 s)"] = elapsed
    # The Job controller's own verdict (syncJob, pastActiveDeadline), within the bound, not 1,800 s.
    assert condition["reason"] == "DeadlineExceeded" and elapsed < BOUND_S, (condition, elapsed)
    job = cluster.read_job(namespace, "never-pull")
    assert job["spec"]["activeDeadlineSeconds"] == 0
    recorded = json.loads(job["metadata"]["annotations"][job_failure.ANNOTATION])
    assert recorded["action"] == "failed" and recorded["reason"] == "ErrImageNeverPull"
    assert (recorded["node"], recorded["image"], recorded["pod"]) == (NODE, "docker.io/" + HELD, pod.metadata.name)
    assert recorded["waited_s"] >= GRACE_S
    (event,) = [e for e in cluster.events(namespace, "Job", "never-pull") if e.reason == job_failure.EVENT_REASON]
    assert event.type == "Warning" and all(text in event.message for text in (
        "ErrImageNeverPull", NODE, "docker.io/" + HELD, never_pull_message(HELD)))
    line = cluster.watchdog.line(job="never-pull")
    assert (line["action"], line["namespace"], line["mode"]) == ("failed", namespace, "enforce")


def test_agent_lightnings_rollout_job_whose_pull_fails_is_failed(cluster):
    """IfNotPresent, as the template writes it: the kubelet tries a registry, which has no such image."""
    namespace = cluster.namespace()
    cluster.job(namespace, "pull-fails", HELD)
    pod = cluster.bound_pod(namespace, "pull-fails")
    message = (f'Failed to pull image "{HELD}": rpc error: code = NotFound desc = failed to pull and unpack image '
               f'"docker.io/{HELD}": pull access denied, repository does not exist or may require authorization')
    condition, _ = _fails_and_kr8s_sees_it(cluster, namespace, "pull-fails", pod, "ErrImagePull", message)
    assert condition["reason"] == "DeadlineExceeded"
    # Deleted by the Job controller (and FakeKubelet); it lets the last finalizer go after Failed.
    wait_for(lambda: cluster.core.list_namespaced_pod(namespace).items == [], "the Pod is gone")


def test_recovered_pods_and_always_images_are_left_alone(cluster):
    namespace = cluster.namespace()
    cluster.job(namespace, "recovers", HELD)
    cluster.job(namespace, "always", HELD.replace(":openai", ":latest"), policy="Always")
    recovers, always = cluster.bound_pod(namespace, "recovers"), cluster.bound_pod(namespace, "always")
    wait_status(cluster.core, recovers, "ErrImagePull", "transient")
    wait_status(cluster.core, always, "ImagePullBackOff", "Back-off pulling image")
    time.sleep(GRACE_S / 3)
    wait_status(cluster.core, recovers, None)  # the image arrived; the kubelet's retry started it
    time.sleep(GRACE_S * 2 + 2)
    for name in ("recovers", "always"):
        job = cluster.read_job(namespace, name)
        assert failed_condition(job) is None
        assert job_failure.ANNOTATION not in (job["metadata"].get("annotations") or {})
        assert [e for e in cluster.events(namespace, "Job", name) if e.reason == job_failure.EVENT_REASON] == []
    assert [x for x in cluster.watchdog.lines() if x.get("namespace") == namespace] == []


def test_a_namespace_that_has_not_opted_in_is_left_alone(cluster):
    namespace = cluster.namespace(opted_in=False)
    cluster.job(namespace, "elsewhere", HELD, policy="Never")
    wait_status(cluster.core, cluster.bound_pod(namespace, "elsewhere"), "ErrImageNeverPull", never_pull_message(HELD))
    time.sleep(GRACE_S + 2)
    assert failed_condition(cluster.read_job(namespace, "elsewhere")) is None
    # Labelled later: the Pod still waits, and the watchdog acts on it then.
    cluster.core.patch_namespace(namespace, {"metadata": {"labels": ENFORCE_LABEL}})
    wait_for(lambda: failed_condition(cluster.read_job(namespace, "elsewhere")), "the Job fails once opted in",
             timeout_s=BOUND_S)


def test_a_bare_pod_gets_an_event_and_nothing_else(cluster):
    namespace = cluster.namespace()
    pod = cluster.core.create_namespaced_pod(namespace, {"metadata": {"name": "bare"}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "agent", "image": HELD, "imagePullPolicy": "Never"}]}})
    pod = wait_for(lambda: (p := cluster.core.read_namespaced_pod("bare", namespace)).spec.node_name and p,
                   "the bare Pod is bound")
    wait_status(cluster.core, pod, "ErrImageNeverPull", never_pull_message(HELD))
    (event,) = wait_for(lambda: [e for e in cluster.events(namespace, "Pod", "bare")
                                 if e.reason == job_failure.EVENT_REASON], "the Pod's Event", timeout_s=BOUND_S)
    assert "it has no controller" in event.message and "ErrImageNeverPull" in event.message
    assert cluster.core.read_namespaced_pod("bare", namespace).metadata.deletion_timestamp is None
    line = cluster.watchdog.line(namespace=namespace)
    assert line["action"] == "event-only"


def test_a_job_whose_pod_the_webhook_denied_fails_at_the_failed_create(cluster):
    """Admitted while the node held the image; the kubelet collected it; the Job controller's next
    Pod is denied by the webhook (FailedCreate) and the Job fails instead of waiting."""
    namespace = cluster.namespace()
    cluster.job(namespace, "denied", LATER, completions=2)
    cluster.bound_pod(namespace, "denied")
    set_node_images(cluster.plane, NODE, [containerd_names(HELD, "a")])
    try:
        probe = job_manifest("probe", LATER)
        wait_for(lambda: _denied(cluster, namespace, probe), "the webhook sees the image gone")
        cluster.batch.patch_namespaced_job("denied", namespace, {"spec": {"parallelism": 2}})
        condition = wait_for(lambda: failed_condition(cluster.read_job(namespace, "denied")), "the Job fails",
                             timeout_s=BOUND_S)
    finally:
        set_node_images(cluster.plane, NODE, [containerd_names(HELD, "a"), containerd_names(LATER, "b")])
    assert condition["reason"] == "DeadlineExceeded"
    denials = [e.message for e in cluster.events(namespace, "Job", "denied") if e.reason == "FailedCreate"]
    assert denials and all(DENIED_PREFIX in m for m in denials), denials
    (event,) = [e for e in cluster.events(namespace, "Job", "denied") if e.reason == job_failure.EVENT_REASON]
    assert "the admission webhook denied its Pod: invalid:" in event.message and LATER in event.message
    line = cluster.watchdog.line(job="denied")
    assert (line["action"], line["reason"]) == ("failed", "FailedCreate")


def _denied(cluster, namespace: str, manifest: dict) -> bool:
    try:
        cluster.batch.create_namespaced_job(namespace, manifest, dry_run="All")
    except ApiException as exc:
        return exc.status == 422
    return False


def _stall(cluster, namespace: str, name: str):
    """A Job in a namespace the running watchdog ignores, its Pod stuck, and the core's stall for it."""
    cluster.job(namespace, name, HELD, policy="Never")
    pod = cluster.bound_pod(namespace, name)
    wait_status(cluster.core, pod, "ErrImageNeverPull", never_pull_message(HELD))
    stalls = Stalls(0)
    stalls.see_pod(cluster.core.api_client.sanitize_for_serialization(cluster.core.read_namespaced_pod(
        pod.metadata.name, namespace)), now=0.0)
    (stall,) = stalls.take_due(0.0, {namespace})
    return stall


def test_two_watchdogs_at_once_act_once(cluster):
    namespace = cluster.namespace(opted_in=False)
    stall = _stall(cluster, namespace, "raced")
    outcomes = []
    barrier = threading.Barrier(2)

    def act(instance: str) -> None:
        actions = Actions(api_client(cluster.kubeconfig), mode="enforce", instance=instance)
        barrier.wait()
        outcomes.append(actions.handle(stall, 1.0))

    threads = [threading.Thread(target=act, args=(f"replica-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted((o.action, o.detail) for o in outcomes) == [("failed", ""), ("skipped", "already")]
    assert len([e for e in cluster.events(namespace, "Job", "raced") if e.reason == job_failure.EVENT_REASON]) == 1
    wait_for(lambda: failed_condition(cluster.read_job(namespace, "raced")), "the Job fails", timeout_s=BOUND_S)


def test_audit_records_and_a_later_enforce_still_acts(cluster):
    namespace = cluster.namespace(opted_in=False)
    stall = _stall(cluster, namespace, "audited")
    audit = Actions(api_client(cluster.kubeconfig), mode="audit", instance="auditor")
    assert audit.handle(stall, 1.0).action == "audited"
    assert audit.handle(stall, 2.0).detail == "already"  # idempotent
    job = cluster.read_job(namespace, "audited")
    assert "activeDeadlineSeconds" not in job["spec"] and failed_condition(job) is None
    assert json.loads(job["metadata"]["annotations"][job_failure.ANNOTATION])["action"] == "audited"
    (event,) = [e for e in cluster.events(namespace, "Job", "audited") if e.reason == job_failure.EVENT_REASON]
    assert "would fail this Job (audit mode)" in event.message
    time.sleep(2)
    assert failed_condition(cluster.read_job(namespace, "audited")) is None
    enforce = Actions(api_client(cluster.kubeconfig), mode="enforce", instance="enforcer")
    assert enforce.handle(stall, 3.0).action == "failed"
    wait_for(lambda: failed_condition(cluster.read_job(namespace, "audited")), "the Job fails", timeout_s=BOUND_S)


def test_metrics_count_actions_by_reason_and_time_them(cluster):
    text = cluster.watchdog.metrics()
    assert 'image_preflight_watchdog_actions_total{action="failed",reason="ErrImageNeverPull"}' in text
    assert 'image_preflight_watchdog_actions_total{action="event-only",reason="ErrImageNeverPull"}' in text
    count = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("image_preflight_watchdog_action_delay_seconds_count"))
    assert count >= 3


def _forged_failed_create(cluster, namespace: str, job: dict, *, in_namespace: str, controller: str) -> None:
    """An events.k8s.io/v1 Event, written by someone allowed to create Events in `in_namespace`,
    saying the Job controller's Pod was denied by our webhook. With eventTime set, the apiserver
    does not hold `regarding` to the Event's namespace (pkg/apis/core/validation/events.go,
    legacyValidateEvent checks only Events without it)."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    k8s.EventsV1Api(cluster.core.api_client).create_namespaced_event(in_namespace, {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"generateName": "forged-", "namespace": in_namespace},
        "eventTime": now, "reportingController": controller, "reportingInstance": "attacker", "action": "Create",
        "reason": "FailedCreate", "type": "Warning",
        "regarding": {"apiVersion": "batch/v1", "kind": "Job", "namespace": namespace,
                      "name": job["metadata"]["name"], "uid": job["metadata"]["uid"]},
        "note": f"Error creating: {DENIED_PREFIX} spec.containers[0].image: forged"})


def test_forged_failed_create_events_fail_no_job_from_another_namespace_or_unconfirmed(cluster):
    """Issue: any writer of Events could fail any opted-in namespace's Job that knows its UID."""
    victims = cluster.namespace()
    attacker = cluster.namespace(opted_in=False)
    job = cluster.job(victims, "victim", HELD, completions=1)
    cluster.bound_pod(victims, "victim")
    # From the attacker's own namespace, naming the Job elsewhere: ignored and said.
    _forged_failed_create(cluster, victims, job, in_namespace=attacker, controller="job-controller")
    # In the Job's namespace, as the Job controller: the dry run of its Pod is admitted (the node
    # holds the image), so the denial does not stand.
    _forged_failed_create(cluster, victims, job, in_namespace=victims, controller="job-controller")
    # In the Job's namespace, from someone else: ignored.
    _forged_failed_create(cluster, victims, job, in_namespace=victims, controller="mallory")
    wait_for(lambda: len([x for x in cluster.watchdog.lines() if x.get("action") == "ignored"]) >= 2,
             "the watchdog says the two untrusted Events are ignored", timeout_s=BOUND_S)
    wait_for(lambda: [x for x in cluster.watchdog.lines() if x.get("job") == "victim"],
             "the watchdog handles the same-namespace forgery", timeout_s=BOUND_S)
    time.sleep(GRACE_S)
    current = cluster.read_job(victims, "victim")
    assert failed_condition(current) is None and "activeDeadlineSeconds" not in current["spec"]
    ignored = [x["detail"] for x in cluster.watchdog.lines() if x.get("action") == "ignored"]
    assert any(f"names Job {victims}/victim, in another namespace" in d for d in ignored), ignored
    assert any("says it comes from mallory, not from the job-controller" in d for d in ignored), ignored
    handled = [x for x in cluster.watchdog.lines() if x.get("job") == "victim"]
    assert {(x["action"], x["detail"]) for x in handled} == {
        ("skipped", "not confirmed: a dry run of its Pod is admitted now")}


def _left_alone(cluster, namespace: str, name: str) -> dict:
    """The watchdog's one line about Job `name`, once written; the Job as it was."""
    (line,) = wait_for(lambda: [x for x in cluster.watchdog.lines() if x.get("job") == name],
                       f"the watchdog handles {name}", timeout_s=BOUND_S)
    job = cluster.read_job(namespace, name)
    assert "activeDeadlineSeconds" not in job["spec"] and failed_condition(job) is None
    assert job_failure.ANNOTATION not in (job["metadata"].get("annotations") or {})
    return line


def test_a_bare_pod_naming_a_job_as_its_controller_fails_no_job(cluster):
    """Anyone who may create Pods in a namespace can write an ownerReference naming any of its Jobs.
    The Job controller releases such a Pod (ClaimObject) when it next syncs the Job; this Job is
    another controller's (spec.managedBy), so the reference stays, as it does on any Job until its
    controller gets round to it."""
    namespace = cluster.namespace()
    job = cluster.job(namespace, "named", HELD, managedBy="example.com/another-controller")
    pod = cluster.core.create_namespaced_pod(namespace, {
        "metadata": {"name": "forged", "labels": {"app": "agl-rollout", "batch.kubernetes.io/job-name": "named"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "named",
                                          "uid": job["metadata"]["uid"], "controller": True}]},
        "spec": {"nodeName": NODE, "restartPolicy": "Never",
                 "containers": [{"name": "agent", "image": HELD, "imagePullPolicy": "Never"}]}})
    wait_status(cluster.core, pod, "ErrImageNeverPull", never_pull_message(HELD))
    line = _left_alone(cluster, namespace, "named")
    assert (line["action"], line["detail"]) == (
        "skipped", "not its Job's Pod: no batch.kubernetes.io/controller-uid label")


def test_a_sandbox_event_fails_no_job_on_a_node_no_agent_reports(cluster):
    """The kubelet's words, reporter and host, written in the Pod's own namespace by anyone who may
    write Events there: NODE has no NodeImages, so nothing the watchdog did not read from the Event
    says the runtime lacks its sandbox image."""
    namespace = cluster.namespace()
    cluster.job(namespace, "unconfirmed", HELD)
    pod = cluster.bound_pod(namespace, "unconfirmed")
    event = kubelet_event(pod, NODE, SANDBOX_MESSAGES["containerd 2.3 Start"],
                          now=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    cluster.core.create_namespaced_event(namespace, event)
    line = _left_alone(cluster, namespace, "unconfirmed")
    assert (line["action"], line["reason"], line["detail"]) == (
        "skipped", "FailedCreatePodSandBox",
        f"not confirmed: node {NODE} has no NodeImages (no node agent reports its runtime)")


WRITE_POLICY = "image-preflight-watchdog-writes"  # what a stolen token may do under it: test_cluster_policies.py


def _policy(cluster):
    """The chart's watchdog write policy, applied for one test: the API-only values leave it out,
    since the other tests here act as the watchdog in namespaces it does not watch."""
    objects = [o for o in render(hooks=False) if o["metadata"]["name"] == WRITE_POLICY]
    assert {o["kind"] for o in objects} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    cluster.plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objects))
    return objects


def _granted(plane) -> set[tuple[str, str, str]]:
    rules = k8s.RbacAuthorizationV1Api(plane.core().api_client).read_cluster_role("image-preflight-watchdog").rules
    return {(g, r, v) for rule in rules for g in rule.api_groups for r in rule.resources for v in rule.verbs}


def test_the_watchdog_role_grants_exactly_what_it_uses(cluster, tmp_path):
    # Run last in the module: by now every kind of request has been made, but the read of its write
    # policy at start. The running watchdog starts without it (the policy would refuse the writes
    # above made where it does not watch): a second one, with the same token, starts here as the
    # chart starts it, watching no namespace.
    outside = cluster.namespace(opted_in=False)
    cluster.job(outside, "probe", HELD, suspend=True)
    # Another token of the account, so that the audit below does not count the probes.
    probe = k8s.BatchV1Api(api_client(cluster.plane.service_account_kubeconfig(
        "image-preflight", "image-preflight-watchdog", tmp_path / "probe.kubeconfig")))

    def unguarded() -> bool:
        try:
            probe.patch_namespaced_job("probe", outside, {"spec": {"activeDeadlineSeconds": 0}}, dry_run="All")
        except ApiException:
            return False
        return True

    objects = _policy(cluster)
    guarded = Watchdog(cluster.plane, cluster.kubeconfig, tmp_path / "guarded.log", "--write-policy", WRITE_POLICY,
                       "--namespace-selector", "image-preflight.test/none=true")
    try:
        guarded.start()
    finally:
        guarded.stop()
        for obj in objects:
            cluster.plane.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found")
        wait_for(unguarded, "the policy is gone: other modules act as the watchdog where it does not watch")
    requests = cluster.plane.audited_requests(cluster.kubeconfig)
    assert [r for r in requests if r["code"] == 403] == []
    used = {(r["group"], r["resource"], r["verb"]) for r in requests}
    assert used == _granted(cluster.plane)
