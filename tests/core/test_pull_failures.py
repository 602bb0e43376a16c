"""The watchdog's pure core: which containers are stuck (core/watchdog/pull_failures), when a stall is due
(core/watchdog/stalls), and what is written to the Job (core/watchdog/job_failure)."""

from __future__ import annotations

import json

import pytest

from image_preflight.core.watchdog import job_failure
from image_preflight.core.watchdog.pull_failures import (
    Owner,
    awaiting_sandbox,
    controller_of,
    finished,
    not_the_jobs_pod,
    sandbox_image_missing,
    sandbox_unconfirmed,
    selects,
    stuck_containers,
    webhook_denial,
)
from image_preflight.core.watchdog.stalls import Stalls
from tests.builders.stalls import (
    JOB_OWNER,
    JOB_POD_LABELS,
    JOB_SELECTOR,
    NS,
    SANDBOX_IMAGE,
    SANDBOX_MESSAGES,
    WEBHOOKS,
    failed_create,
    node_images,
    sandbox_event,
    unstarted,
)
from tests.builders.stalls import (
    waiting_pod as pod,
)

# --- which containers are stuck (pkg/kubelet/images/types.go reasons) ------------------------------

@pytest.mark.parametrize("reason,policy,stuck", [
    ("ErrImageNeverPull", "Never", True),
    ("InvalidImageName", "Always", True),  # can never parse, whatever the policy
    ("ErrImagePull", "IfNotPresent", True),
    ("ImagePullBackOff", "IfNotPresent", True),
    ("ErrImagePull", "Always", False),  # a registry's image: left alone by default
    ("ImagePullBackOff", "Always", False),
    ("ContainerCreating", "IfNotPresent", False),
    ("CrashLoopBackOff", "IfNotPresent", False),
    (None, "IfNotPresent", False),
])
def test_stuck_containers_follow_the_kubelet_reason_and_the_pull_policy(reason, policy, stuck):
    assert bool(stuck_containers(pod(reason=reason, policy=policy))) is stuck


def test_always_images_are_included_when_asked():
    (found,) = stuck_containers(pod(reason="ImagePullBackOff", policy="Always"), include_always=True)
    assert found.pull_policy == "Always"


def test_an_undeclared_policy_is_defaulted_as_the_apiserver_does():
    # ':latest' defaults to Always (pkg/apis/core/v1/defaults.go): a failed pull is left alone.
    assert stuck_containers(pod(reason="ErrImagePull", image="swe/task:latest", policy=None)) == ()
    (found,) = stuck_containers(pod(reason="ErrImagePull", image="swe/task:openai", policy=None))
    assert found.pull_policy == "IfNotPresent"


def test_the_stuck_container_names_the_image_normalized_and_the_kubelets_words():
    (found,) = stuck_containers(pod(image="swe/task:openai"))
    assert (found.container, found.image, found.reference) == ("agent", "swe/task:openai", "docker.io/swe/task:openai")
    assert (found.reason, found.message) == ("ErrImageNeverPull", "kubelet says ErrImageNeverPull")
    (invalid,) = stuck_containers(pod(reason="InvalidImageName", image="Not A Name"))
    assert invalid.reference == "Not A Name"


def test_init_containers_hold_the_pod_back_too():
    (found,) = stuck_containers(pod(init=True))
    assert found.container == "agent"


def test_ephemeral_containers_are_not_counted():
    stuck = pod()
    stuck["status"]["ephemeralContainerStatuses"] = stuck["status"].pop("containerStatuses")
    assert stuck_containers(stuck) == ()


@pytest.mark.parametrize("change", [
    {"metadata": {"deletionTimestamp": "2026-11-30T00:00:00Z"}},
    {"status": {"phase": "Failed"}},
    {"status": {"phase": "Succeeded"}},
])
def test_a_pod_being_deleted_or_terminal_is_not_stuck(change):
    stuck = pod()
    for key, value in change.items():
        stuck[key] = {**stuck[key], **value}
    assert stuck_containers(stuck) == ()


@pytest.mark.parametrize("status", [None, "x", {"containerStatuses": "x"}, {"containerStatuses": [None, 3]},
                                    {"containerStatuses": [{"state": {"waiting": "x"}}]}])
def test_unreadable_statuses_are_not_stuck_and_never_raise(status):
    broken = pod()
    broken["status"] = status
    assert stuck_containers(broken) == ()


def test_a_status_for_an_undeclared_container_uses_its_own_image():
    odd = pod()
    odd["spec"]["containers"] = "not a list"
    (found,) = stuck_containers(odd)
    assert found.image == "swe/task:openai" and found.pull_policy == "IfNotPresent"


def test_the_controller_is_the_owner_reference_marked_so():
    assert controller_of(pod()) == Owner("batch/v1", "Job", "agl-rollout-1", "job-uid")
    assert controller_of(pod()).is_job
    assert controller_of(pod(owner={**JOB_OWNER, "controller": False})) is None
    assert not controller_of(pod(owner={**JOB_OWNER, "apiVersion": "apps/v1", "kind": "ReplicaSet"})).is_job
    assert controller_of({"metadata": {"ownerReferences": "x"}}) is None


@pytest.mark.parametrize("kind,expected", [("Failed", "Failed"), ("Complete", "Complete"),
                                           ("FailureTarget", "FailureTarget"), ("Suspended", None)])
def test_a_job_with_a_finishing_condition_is_finished(kind, expected):
    job = {"status": {"conditions": [{"type": kind, "status": "True"}]}}
    assert finished(job) == expected
    assert finished({"status": {"conditions": [{"type": kind, "status": "False"}]}}) is None


# --- the Job controller's FailedCreate carrying a webhook's denial ----------------------------------


def test_a_failed_create_carrying_our_denial_is_recognised():
    assert webhook_denial(failed_create(), WEBHOOKS) == "invalid: image x is absent"


@pytest.mark.parametrize("event", [failed_create("other.example.com"), failed_create(reason="SuccessfulCreate"),
                                   failed_create(kind="ReplicaSet"),
                                   {**failed_create(), "message": "Error creating: pods is forbidden: quota"}])
def test_other_failed_creates_are_not(event):
    assert webhook_denial(event, WEBHOOKS) is None


# --- when a stall is due ------------------------------------------------------------------------


def stalls(grace: float = 15.0) -> Stalls:
    return Stalls(grace, webhooks=WEBHOOKS)


def test_a_pod_is_due_once_it_has_been_stuck_for_the_grace():
    memory = stalls()
    memory.see_pod(pod(), now=100.0)
    memory.see_pod(pod(reason="ImagePullBackOff"), now=110.0)  # still stuck: the first sighting counts
    assert memory.take_due(114.9, {NS}) == []
    assert memory.next_due({NS}) == 115.0
    (due,) = memory.take_due(115.0, {NS})
    assert (due.since, due.stuck.reason, due.node, due.owner.name) == (
        100.0, "ImagePullBackOff", "cpu-a", "agl-rollout-1")
    assert memory.take_due(200.0, {NS}) == []  # handed out once
    memory.see_pod(pod(), now=201.0)
    assert memory.take_due(300.0, {NS}) == []  # still the same Pod: not again


def test_a_pod_that_recovers_within_the_grace_is_left_alone_and_a_new_wait_starts_over():
    memory = stalls()
    memory.see_pod(pod(), now=0.0)
    memory.see_pod(pod(reason=None), now=5.0)
    assert memory.take_due(100.0, {NS}) == [] and len(memory) == 0
    memory.see_pod(pod(), now=100.0)
    assert memory.take_due(114.0, {NS}) == []
    assert len(memory.take_due(115.0, {NS})) == 1


def test_only_opted_in_namespaces_are_handed_out_and_a_later_opt_in_gets_its_stuck_pods():
    memory = stalls()
    memory.see_pod(pod(namespace="elsewhere"), now=0.0)
    assert memory.take_due(100.0, {NS}) == [] and memory.next_due({NS}) is None
    assert [s.namespace for s in memory.take_due(100.0, {NS, "elsewhere"})] == ["elsewhere"]


def test_a_failed_action_is_handed_out_again_unless_its_pod_went():
    memory = stalls(grace=0)
    memory.see_pod(pod(), now=0.0)
    (due,) = memory.take_due(0.0, {NS})
    memory.retry(due, at=5.0)
    assert memory.take_due(4.0, {NS}) == [] and memory.take_due(5.0, {NS}) == [due]
    memory.forget_pod(pod())
    memory.retry(due, at=6.0)
    assert memory.take_due(100.0, {NS}) == []


def test_a_relist_forgets_pods_that_went_and_keeps_denials():
    memory = stalls()
    memory.see_pod(pod(uid="a"), now=0.0)
    memory.see_pod(pod(uid="b"), now=0.0)
    memory.see_event(failed_create(), now=0.0)
    memory.replace("pod/", ["pod/b"])
    assert sorted(s.key for s in memory.take_due(100.0, {NS})) == ["job/job-uid", "pod/b"]


def test_a_denial_is_due_at_once_and_once_per_job():
    memory = stalls()
    memory.see_event(failed_create(), now=7.0)
    memory.see_event({**failed_create(), "metadata": {"name": "another", "namespace": NS}}, now=8.0)
    (due,) = memory.take_due(7.0, {NS})
    assert (due.kind, due.name, due.owner.uid, due.denial) == (
        "Job", "agl-rollout-1", "job-uid", "invalid: image x is absent")
    memory.see_event(failed_create(), now=9.0)
    assert memory.take_due(100.0, {NS}) == []


# --- what is written to the Job ------------------------------------------------------------------


def job(**changes) -> dict:
    base = {"metadata": {"name": "agl-rollout-1", "namespace": NS, "uid": "job-uid", "resourceVersion": "42",
                         "annotations": {}},
            "spec": {"backoffLimit": 0, "selector": JOB_SELECTOR},
            "status": {"startTime": "2026-11-30T00:00:00Z", "active": 1}}
    for key, value in changes.items():
        base[key] = {**base[key], **value}
    return base


def due_pod():
    memory = stalls(grace=0)
    memory.see_pod(pod(), now=0.0)
    return memory.take_due(0.0, {NS})[0]


@pytest.mark.parametrize("mode", job_failure.MODES)
def test_a_running_job_is_acted_on_with_a_patch_conditional_on_its_version(mode):
    assert job_failure.skip_reason(job(), "job-uid", mode) is None
    content = job_failure.record(due_pod(), job_failure.FAILED, at="t", waited_s=15.0)
    patch = job_failure.job_patch(job(), mode, content)
    assert patch["metadata"]["resourceVersion"] == "42"
    assert json.loads(patch["metadata"]["annotations"][job_failure.ANNOTATION]) == content
    assert ("spec" in patch) is (mode == job_failure.ENFORCE)
    if mode == job_failure.ENFORCE:
        assert patch["spec"] == {"activeDeadlineSeconds": 0}


@pytest.mark.parametrize("changes,mode,reason", [
    ({"metadata": {"uid": "another"}}, "enforce", "replaced"),
    ({"status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}}, "enforce", "finished"),
    ({"spec": {"suspend": True}}, "enforce", "suspended"),
    ({"metadata": {"annotations": {job_failure.ANNOTATION: '{"action": "failed"}'}}}, "enforce", "already"),
    ({"metadata": {"annotations": {job_failure.ANNOTATION: '{"action": "audited"}'}}}, "audit", "already"),
    # The other watchdog's patch won and the Job controller already acted on it.
    ({"metadata": {"annotations": {job_failure.ANNOTATION: '{"action": "failed"}'}},
      "status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}}, "enforce", "already"),
    ({"metadata": {"annotations": {job_failure.ANNOTATION: '{"action": "audited"}'}}}, "enforce", None),
    ({"metadata": {"annotations": {job_failure.ANNOTATION: "not json"}}}, "enforce", None),
])
def test_a_job_is_left_alone_when_replaced_finished_suspended_or_already_handled(changes, mode, reason):
    merged = job()
    for key, value in changes.items():
        merged[key] = {**merged[key], **value}
    assert job_failure.skip_reason(merged, "job-uid", mode) == reason


def test_the_event_names_image_node_and_reason_and_its_name_is_the_same_for_every_writer():
    stall = due_pod()
    message = job_failure.job_message(stall, job_failure.FAILED)
    assert "ErrImageNeverPull" in message and "cpu-a" in message and "docker.io/swe/task:openai" in message
    first, second = (job_failure.event(stall, kind="Job", name="agl-rollout-1", uid="job-uid", api_version="batch/v1",
                                       action=job_failure.FAILED, message=message, at="t", instance=i)
                     for i in ("a", "b"))
    assert first["metadata"]["name"] == second["metadata"]["name"]
    long = job_failure.event(stall, kind="Pod", name="p" * 253, uid="u", api_version="v1",
                             action=job_failure.EVENT_ONLY, message="m" * 5000, at="t", instance="i" * 300)
    assert len(long["metadata"]["name"]) <= 253 and len(long["message"]) <= job_failure.MAX_EVENT_MESSAGE
    assert len(long["reportingInstance"]) <= 128


# --- the kubelet's FailedCreatePodSandBox: the runtime lacks its sandbox image ----------------------

SANDBOX_IMAGES = {"containerd 2.3 Start": "registry.k8s.io/pause:3.10.1",
                  "containerd 2.3 pre-pull": "registry.k8s.io/pause:3.10.1",
                  "containerd 1.6": "registry.k8s.io/pause:3.6"}


@pytest.mark.parametrize("version", SANDBOX_MESSAGES)
def test_the_runtimes_words_for_a_missing_sandbox_image_are_recognised(version):
    failure = sandbox_image_missing(sandbox_event(SANDBOX_MESSAGES[version]))
    assert (failure.pod_uid, failure.namespace, failure.pod, failure.node, failure.image) == (
        "pod-uid", NS, "agl-rollout-1-abcde", "cpu-a", SANDBOX_IMAGES[version])


@pytest.mark.parametrize("event", [
    # A registry out of reach may answer the kubelet's next attempt: not a missing image.
    sandbox_event('Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox image '
                  '"registry.k8s.io/pause:3.6": failed to pull image "registry.k8s.io/pause:3.6": failed to pull and '
                  'unpack image "registry.k8s.io/pause:3.6": failed to resolve reference "registry.k8s.io/pause:3.6": '
                  'failed to do request: Head "https://registry.k8s.io/v2/pause/manifests/3.6": dial tcp: lookup '
                  'registry.k8s.io: no such host'),
    sandbox_event('Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox '
                  '"5b1e2a": plugin type="calico" failed (add): error getting ClusterInformation: connection is '
                  'unauthorized: Unauthorized'),
    sandbox_event('Failed to create pod sandbox: rpc error: code = NotFound desc = failed to create containerd task: '
                  'failed to create shim task: OCI runtime create failed: runc create failed: not found'),
    sandbox_event(reason="FailedCreate"),
    sandbox_event(kind="Job"),
    sandbox_event(uid=""),
    sandbox_event('Failed to create pod sandbox: rpc error: code = NotFound desc = failed to get sandbox image "x: '
                  + "y" * 2000),
])
def test_other_sandbox_failures_are_not(event):
    assert sandbox_image_missing(event) is None


@pytest.mark.parametrize("changes,waiting", [
    ({}, True),
    ({"status": {"containerStatuses": None}}, True),  # just bound: no status posted yet
    ({"status": {"phase": "Running"}}, False),
    ({"spec": {"nodeName": ""}}, False),  # not bound: no kubelet has tried
    ({"status": {"conditions": [{"type": "PodReadyToStartContainers", "status": "True"}]}}, False),
    ({"status": {"containerStatuses": [{"name": "agent", "state": {"waiting": {"reason": "ErrImagePull"}}}]}}, False),
    ({"status": {"containerStatuses": [{"name": "agent", "state": {"running": {}}}]}}, False),
    ({"metadata": {"deletionTimestamp": "2026-11-30T00:00:00Z"}}, False),
])
def test_a_pod_awaits_its_sandbox_while_bound_and_nothing_shows_its_sandbox_up(changes, waiting):
    assert awaiting_sandbox(unstarted(**changes)) is waiting


@pytest.mark.parametrize("pod_first", [True, False])
def test_a_pod_reported_without_its_sandbox_image_is_due_after_the_grace_whichever_comes_first(pod_first):
    memory = stalls()
    if pod_first:
        memory.see_pod(unstarted(), now=90.0)
    memory.see_event(sandbox_event(), now=100.0)
    memory.see_event(sandbox_event(), now=110.0)  # reported again: the first report counts
    if not pod_first:
        memory.see_pod(unstarted(), now=105.0)
    assert memory.take_due(114.9, {NS}) == [] and memory.next_due({NS}) == 115.0
    (due,) = memory.take_due(115.0, {NS})
    assert (due.key, due.kind, due.name, due.node, due.owner.name, due.since) == (
        "sandbox/pod-uid", "Pod", "agl-rollout-1-abcde", "cpu-a", "agl-rollout-1", 100.0)
    assert (due.stuck.reason, due.stuck.image, due.stuck.container) == (
        "FailedCreatePodSandBox", "registry.k8s.io/pause:3.10.1", "")
    memory.see_event(sandbox_event(), now=120.0)
    assert memory.take_due(300.0, {NS}) == []  # handed out once


def test_a_report_without_its_pod_or_with_its_sandbox_up_since_is_never_due():
    memory = stalls()
    memory.see_event(sandbox_event(), now=0.0)  # the Pod is not (yet) in the watch
    assert memory.take_due(100.0, {NS}) == [] and len(memory) == 0
    memory.see_pod(unstarted(), now=1.0)
    memory.see_pod(unstarted(status={"conditions": [{"type": "PodReadyToStartContainers", "status": "True"}]}),
                   now=5.0)  # the image was imported and the kubelet's retry created the sandbox
    assert memory.take_due(100.0, {NS}) == [] and len(memory) == 0


def test_a_pod_that_goes_or_an_event_that_expires_is_forgotten():
    memory = stalls()
    memory.see_pod(unstarted(), now=0.0)
    memory.see_event(sandbox_event(), now=0.0)
    memory.forget_pod(unstarted())
    assert memory.take_due(100.0, {NS}) == []
    memory.see_pod(unstarted(), now=0.0)
    memory.see_event(sandbox_event(), now=0.0)
    memory.forget_event(sandbox_event())  # the Event's TTL ran out
    assert memory.take_due(100.0, {NS}) == []


def test_relists_forget_the_reports_and_pods_they_no_longer_hold():
    memory = stalls()
    memory.see_pod(unstarted(), now=0.0)
    memory.see_event(sandbox_event(), now=0.0)
    memory.replace("job/", [])  # the FailedCreate watch's relist leaves the sandbox reports alone
    memory.replace("pod/", ["pod/pod-uid"])
    assert [s.key for s in memory.take_due(100.0, {NS})] == ["sandbox/pod-uid"]
    for relist in ("report/", "pod/"):
        memory = stalls()
        memory.see_pod(unstarted(), now=0.0)
        memory.see_event(sandbox_event(), now=0.0)
        memory.replace(relist, [])
        assert memory.take_due(100.0, {NS}) == [], relist


def test_the_job_event_and_annotation_name_the_node_and_the_sandbox_image():
    memory = stalls(grace=0)
    memory.see_pod(unstarted(), now=0.0)
    memory.see_event(sandbox_event(), now=0.0)
    (stall,) = memory.take_due(0.0, {NS})
    message = job_failure.job_message(stall, job_failure.FAILED)
    assert message.startswith("image-preflight watchdog failed this Job: pod agl-rollout-1-abcde on node cpu-a cannot "
                              "start: the container runtime there lacks its sandbox image "
                              "registry.k8s.io/pause:3.10.1 (FailedCreatePodSandBox): Failed to create pod sandbox: ")
    content = job_failure.record(stall, job_failure.AUDITED, at="t", waited_s=15.0)
    assert (content["reason"], content["image"], content["node"], content["container"], content["pod"]) == (
        "FailedCreatePodSandBox", "registry.k8s.io/pause:3.10.1", "cpu-a", "", "agl-rollout-1-abcde")
    assert job_failure.job_patch(job(), job_failure.AUDIT, content) == {"metadata": {
        "resourceVersion": "42", "annotations": {job_failure.ANNOTATION: json.dumps(content, sort_keys=True)}}}


# --- Events taken at their word only where they may be -----------------------------------------


@pytest.mark.parametrize(("change", "why"), [
    # An events.k8s.io/v1 Event may name an object of another namespace (legacyValidateEvent checks
    # the two only without eventTime): written where its writer may write, aimed elsewhere.
    ({"metadata": {"name": "forged", "namespace": "elsewhere", "uid": "forged-uid"}},
     "Event elsewhere/forged names Job rollouts/agl-rollout-1, in another namespace"),
    ({"source": {"component": "someone"}, "reportingComponent": "someone"},
     "Event rollouts/agl-rollout-1.1 says it comes from someone, not from the job-controller"),
    ({"source": {}, "reportingComponent": ""},
     "Event rollouts/agl-rollout-1.1 says it comes from nobody, not from the job-controller"),
])
def test_a_denial_event_that_cannot_be_trusted_is_said_once_and_never_due(change, why):
    memory = Stalls(grace=15.0, webhooks=WEBHOOKS)
    forged = {**failed_create(), **change}
    assert memory.see_event(forged, now=0.0) == why
    assert memory.see_event(forged, now=1.0) is None  # a relist brings it again: said once
    assert memory.take_due(100.0, {NS, "elsewhere"}) == []
    memory.forget_event(forged)
    assert memory.see_event(forged, now=2.0) == why  # gone and back: said again


def test_a_sandbox_event_is_trusted_from_the_kubelet_in_the_pods_namespace_only():
    memory = Stalls(grace=15.0)
    assert memory.see_event({**sandbox_event(), "metadata": {"name": "e", "namespace": "other", "uid": "u"}},
                            now=0.0).endswith("in another namespace")
    assert memory.see_event({**sandbox_event(), "source": {"component": "job-controller"},
                             "reportingComponent": "job-controller"}, now=0.0).endswith("not from the kubelet")
    assert memory.see_event(sandbox_event(), now=0.0) is None


def test_events_the_watchdog_does_not_act_on_are_not_judged():
    memory = Stalls(grace=15.0, webhooks=WEBHOOKS)
    other = {**failed_create(webhook="someone-elses.example"), "metadata": {"name": "x", "namespace": "elsewhere"}}
    assert memory.see_event(other, now=0.0) is None


# --- a sandbox report counts only for the very Pod it names, and only as its node confirms -------------


def _elsewhere(**involved) -> dict:
    """A FailedCreatePodSandBox written in a namespace its writer owns, naming that namespace (so
    untrusted() lets it pass) and the uid of a Pod in another."""
    event = sandbox_event()
    return {**event, "metadata": {"name": "forged", "namespace": "attacker", "uid": "forged-uid"},
            "involvedObject": {**event["involvedObject"], "namespace": "attacker", **involved}}


@pytest.mark.parametrize("pod_first", [True, False])
def test_a_sandbox_report_from_another_namespace_naming_a_pods_uid_never_makes_it_due(pod_first):
    memory = stalls()
    if pod_first:
        memory.see_pod(unstarted(), now=0.0)
        assert memory.see_event(_elsewhere(), now=1.0) == (
            "Event in attacker names Pod attacker/agl-rollout-1-abcde uid pod-uid, which is Pod "
            "rollouts/agl-rollout-1-abcde")
    else:
        assert memory.see_event(_elsewhere(), now=1.0) is None  # the Pod unknown yet: kept by what it names
        memory.see_pod(unstarted(), now=2.0)
    assert memory.take_due(1000.0, {NS, "attacker"}) == [] and len(memory) == 0


@pytest.mark.parametrize("involved", [{"name": "another-pod"}, {"namespace": "attacker"}])
def test_a_sandbox_report_in_the_pods_namespace_naming_another_name_or_namespace_is_not_about_it(involved):
    memory = stalls()
    memory.see_pod(unstarted(), now=0.0)
    event = sandbox_event()
    event = {**event, "involvedObject": {**event["involvedObject"], **involved}}
    memory.see_event(event, now=0.0)  # another namespace named: untrusted(); another name: not_about()
    assert memory.take_due(1000.0, {NS, "attacker"}) == []


def test_a_report_from_elsewhere_neither_delays_nor_cancels_the_pods_own():
    memory = stalls()
    memory.see_pod(unstarted(), now=0.0)
    memory.see_event(_elsewhere(), now=1.0)
    memory.see_event(sandbox_event(), now=5.0)
    memory.forget_event(_elsewhere())  # the forgery deleted
    memory.replace("report/", ["report/rollouts/agl-rollout-1-abcde/pod-uid"])
    (due,) = memory.take_due(20.0, {NS})
    assert (due.key, due.since) == ("sandbox/pod-uid", 5.0)


def test_a_sandbox_stall_names_the_pods_node_and_labels_never_the_events_host():
    memory = stalls(grace=0)
    memory.see_pod(unstarted(), now=0.0)
    event = sandbox_event()
    memory.see_event({**event, "source": {"component": "kubelet", "host": "victim-node"}}, now=0.0)
    (due,) = memory.take_due(0.0, {NS})
    assert due.node == "cpu-a" and dict(due.labels) == JOB_POD_LABELS


def test_a_pod_stall_carries_the_pods_labels():
    memory = stalls(grace=0)
    memory.see_pod(pod(), now=0.0)
    (due,) = memory.take_due(0.0, {NS})
    assert dict(due.labels) == JOB_POD_LABELS


NOW = 1_000_100.0  # within node_images()' lease (observed 1,000,000, 300 s)


@pytest.mark.parametrize("obj,image,why", [
    (node_images(), SANDBOX_IMAGE, None),
    # The runtime's configuration and containerd's quote may spell the name differently.
    (node_images(image="registry.k8s.io/pause:3.10.1"), "registry.k8s.io/pause:3.10.1", None),
    (node_images(image="pause:3.6"), "docker.io/library/pause:3.6", None),
    (node_images(present=True), SANDBOX_IMAGE,
     f"node cpu-a's NodeImages says its runtime holds its sandbox image {SANDBOX_IMAGE}"),
    (node_images(present=None), SANDBOX_IMAGE,
     "node cpu-a's NodeImages does not say whether its runtime holds its sandbox image"),
    (node_images(image="registry.k8s.io/pause:3.9"), SANDBOX_IMAGE,
     f"node cpu-a's NodeImages says its runtime lacks sandbox image registry.k8s.io/pause:3.9, not {SANDBOX_IMAGE}"),
    (node_images(observed_at=NOW - 400), SANDBOX_IMAGE,
     "node cpu-a's NodeImages is not current (observed 1970-01-12T13:41:40Z, lease until 1970-01-12T13:46:40Z)"),
    (node_images(observed_at=NOW + 3600), SANDBOX_IMAGE,  # a clock far ahead keeps no list current
     "node cpu-a's NodeImages is not current (observed 1970-01-12T14:48:20Z, lease until 1970-01-12T14:53:20Z)"),
    (node_images("cpu-b"), SANDBOX_IMAGE, "NodeImages cpu-b speaks for node cpu-b, not cpu-a"),
    ({"metadata": {"name": "cpu-a"}, "spec": {"nodeName": "cpu-a"}}, SANDBOX_IMAGE,
     "node cpu-a's NodeImages cannot be read (spec.observedAt: missing or not an RFC 3339 time)"),
    ({}, SANDBOX_IMAGE, "node cpu-a's NodeImages cannot be read (spec: missing)"),
])
def test_only_the_nodes_own_current_nodeimages_saying_the_sandbox_image_absent_confirms_it(obj, image, why):
    assert sandbox_unconfirmed(obj, "cpu-a", image, NOW) == why


# --- whose Pod it is: the Job's uid label and its selector -------------------------------------------


@pytest.mark.parametrize("selector,labels,selected", [
    (None, {"a": "1"}, False),  # null selects nothing (labels.Nothing)
    ({}, {"a": "1"}, True),  # empty selects everything (labels.Everything)
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchLabels": {"a": "1"}}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),  # absent: not in
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"}, False),
    # What LabelSelectorAsSelector refuses selects nothing.
    ({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn"}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchLabels": "a=1"}, {"a": "1"}, False),
])
def test_a_label_selector_selects_as_apimachinery_reads_it(selector, labels, selected):
    assert selects(selector, labels) is selected


@pytest.mark.parametrize("labels,selector,why", [
    (JOB_POD_LABELS, JOB_SELECTOR, None),
    ({"controller-uid": "job-uid"}, {"matchLabels": {"controller-uid": "job-uid"}}, None),  # before 1.27
    # A bare Pod whose ownerReference names the Job, without the Job's labels.
    ({"app": "agl-rollout"}, JOB_SELECTOR, "not its Job's Pod: no batch.kubernetes.io/controller-uid label"),
    ({**JOB_POD_LABELS, "batch.kubernetes.io/controller-uid": "another-job"}, JOB_SELECTOR,
     "not its Job's Pod: its controller-uid label is 'another-job', not the Job's uid job-uid"),
    (JOB_POD_LABELS, {"matchLabels": {"batch.kubernetes.io/controller-uid": "job-uid", "extra": "x"}},
     "not its Job's Pod: the Job's selector does not select it"),
    (JOB_POD_LABELS, None, "not its Job's Pod: the Job's selector does not select it"),
])
def test_a_pod_is_its_jobs_only_with_the_jobs_uid_label_and_selected_by_the_jobs_selector(labels, selector, why):
    assert not_the_jobs_pod(job(spec={"selector": selector}), labels) == why
