"""The chart's ValidatingAdmissionPolicies on the real apiserver: what a stolen token of the
watchdog's ServiceAccount may still change of a Job (only what the watchdog's own patch changes),
and the watchdog and the node agent refusing to start while their policy or its binding is missing.

RBAC grants the watchdog `patch` on every Job and `create` on every Pod, cluster-wide: the policy is
all that narrows them. Each change tried here is one the apiserver itself accepts (an admin's dry
run of it is admitted), so a refusal is the policy's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.core.watchdog import job_failure
from image_preflight.kube.client import api_client
from tests.builders.stalls import ENFORCE_LABEL, failed_condition, job_manifest
from tests.chart import API_ONLY, render
from tests.cluster.watchdog_process import BOUND_S, Watchdog
from tests.controlplane.cluster import delete_namespaces, new_namespace, terminate, wait_for

# As the chart names them (templates/watchdog/policy.yaml, templates/agent/policy.yaml).
WATCHDOG_POLICY = "image-preflight-watchdog-writes"
AGENT_POLICY = "image-preflight-agent-own-node"
REFUSED_JOB_CHANGE = "image-preflight-watchdog changes a Job's activeDeadlineSeconds (to 0) and its own annotation"
IMAGE = "swe-smith/task-policies:openai"


def _chart_objects(names: set[str], values: dict | None = None) -> list[dict]:
    return [o for o in render(values, hooks=False) if o["metadata"]["name"] in names]


def _apply(plane, objects: list[dict]) -> None:
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(objects))


def _delete(plane, *names: str) -> None:
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        plane.kubectl("delete", kind, *names, "--ignore-not-found")


def _answer(call) -> str:
    """'admitted', or the status and message of the refusal."""
    try:
        call()
    except ApiException as exc:
        return f"{exc.status} {json.loads(exc.body)['message']}"
    return "admitted"


class Stolen:
    """A token of the watchdog's ServiceAccount, an opted-in namespace and one that is not."""

    def __init__(self, plane, tmp_path_factory) -> None:
        self.plane = plane
        self.admin = k8s.BatchV1Api(plane.core().api_client)
        self.checked, self.outside = new_namespace(plane, ENFORCE_LABEL), new_namespace(plane)
        kubeconfig = plane.service_account_kubeconfig("image-preflight", "image-preflight-watchdog",
                                                      tmp_path_factory.mktemp("stolen") / "watchdog.kubeconfig")
        self.batch = k8s.BatchV1Api(api_client(kubeconfig))
        self.core = k8s.CoreV1Api(self.batch.api_client)
        self.admin.create_namespaced_job(self.outside, self.suspended("target"))

    @staticmethod
    def suspended(name: str, **spec) -> dict:
        """A Job created suspended, as Kueue holds one: its pod template may still change."""
        manifest = job_manifest(name, IMAGE)
        manifest["metadata"]["annotations"] = {"team": "rl"}
        manifest["spec"].update({"suspend": True, "activeDeadlineSeconds": 600, **spec})
        return manifest

    def job(self, manifest: dict) -> dict:
        created = self.admin.create_namespaced_job(self.checked, manifest)
        return self.admin.api_client.sanitize_for_serialization(created)

    def guarded(self) -> bool:
        """Whether the policy is in the admission chain: it refuses the watchdog's own patch outside."""
        fail = {"spec": {"activeDeadlineSeconds": 0}}
        return _answer(lambda: self.batch.patch_namespaced_job("target", self.outside, fail,
                                                               dry_run="All")) != "admitted"


@pytest.fixture(scope="module")
def stolen(service_accounts, tmp_path_factory):
    """A stolen token and its namespaces; after the module, both write policies removed, their
    effect gone."""
    state = Stolen(service_accounts, tmp_path_factory)
    try:
        yield state
    finally:
        _delete(service_accounts, WATCHDOG_POLICY, AGENT_POLICY)
        # The other modules act as the watchdog where it does not watch (tests.chart.apply).
        wait_for(lambda: not state.guarded(), "the watchdog's policy is gone")
        delete_namespaces(service_accounts, [state.checked, state.outside])


@pytest.fixture
def guarded(stolen):
    """The watchdog's write policy and binding, as the chart renders them, in force."""
    _apply(stolen.plane, _chart_objects({WATCHDOG_POLICY}))
    # A ValidatingAdmissionPolicy takes a moment to reach the admission chain.
    wait_for(stolen.guarded, "the policy refuses the watchdog outside the checked namespaces")
    return stolen


NODE_SELECTOR = {"spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": "attacker"}}}}}
ATTACKS = {
    # Mutable while a Job is suspended and has never started (pkg/apis/batch/validation,
    # validateJobTemplateUpdate): where its Pods run, and what selects them.
    "the pod template's nodeSelector": NODE_SELECTOR,
    "the pod template's tolerations": {"spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}},
    "the pod template's labels": {"spec": {"template": {"metadata": {"labels": {"app": "elsewhere"}}}}},
    # The garbage collector deletes a Job whose owner does not exist.
    "an ownerReference": {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone",
                                                             "uid": str(uuid.uuid4())}]}},
    # A Job without its deadline runs for ever.
    "activeDeadlineSeconds removed": {"spec": {"activeDeadlineSeconds": None}},
    "activeDeadlineSeconds raised": {"spec": {"activeDeadlineSeconds": 86400}},
    "a finalizer": {"metadata": {"finalizers": ["example.com/hold"]}},
    "another annotation changed": {"metadata": {"annotations": {"team": "other"}}},
    "another annotation removed": {"metadata": {"annotations": {"team": None}}},
    "the Job's labels": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "someone-else"}}},
    "the watchdog's patch and the nodeSelector together": {
        "metadata": {"annotations": {job_failure.ANNOTATION: "{}"}},
        "spec": {"activeDeadlineSeconds": 0, **NODE_SELECTOR["spec"]}},
}


@pytest.mark.parametrize("change", ATTACKS.values(), ids=ATTACKS.keys())
def test_a_stolen_watchdog_token_changes_nothing_of_a_job_but_what_the_watchdog_does(guarded, change):
    """Each change the apiserver accepts from an admin, refused from the watchdog's token."""
    name = f"target-{uuid.uuid4().hex[:6]}"
    guarded.job(Stolen.suspended(name))
    assert _answer(lambda: guarded.admin.patch_namespaced_job(name, guarded.checked, change,
                                                              dry_run="All")) == "admitted"
    said = _answer(lambda: guarded.batch.patch_namespaced_job(name, guarded.checked, change, dry_run="All"))
    assert said.startswith("403 ") and REFUSED_JOB_CHANGE in said, said  # reason Forbidden


@pytest.mark.parametrize("deadline", [600, None], ids=["a deadline", "no deadline"])
@pytest.mark.parametrize("mode", job_failure.MODES)
def test_the_watchdogs_own_patch_is_admitted_and_fails_the_job(guarded, deadline, mode):
    """job_failure.job_patch on the Job as the watchdog reads it (with its token, read again on a
    409 as watchdog/actions.py does): the annotation, and in enforce mode activeDeadlineSeconds 0,
    on which the Job controller fails the Job."""
    name = f"stalled-{uuid.uuid4().hex[:6]}"
    manifest = Stolen.suspended(name, suspend=False, activeDeadlineSeconds=deadline)
    if deadline is None:
        del manifest["spec"]["activeDeadlineSeconds"]
    guarded.job(manifest)
    content = {"action": "failed" if mode == job_failure.ENFORCE else "audited", "reason": "ErrImageNeverPull"}

    def read(api):
        return api.api_client.sanitize_for_serialization(api.read_namespaced_job(name, guarded.checked))

    def patched() -> str:
        patch = job_failure.job_patch(read(guarded.batch), mode, content)
        said = _answer(lambda: guarded.batch.patch_namespaced_job(name, guarded.checked, patch))
        return "" if said.startswith("409 ") else said  # the Job controller wrote in between

    assert wait_for(patched, "the patch on a Job read unchanged") == "admitted"
    stored = read(guarded.admin)
    assert json.loads(stored["metadata"]["annotations"][job_failure.ANNOTATION]) == content
    if mode == job_failure.ENFORCE:
        assert stored["spec"]["activeDeadlineSeconds"] == 0
        wait_for(lambda: failed_condition(read(guarded.admin)), "the Job fails", timeout_s=BOUND_S)
    else:
        assert stored["spec"].get("activeDeadlineSeconds") == deadline


def test_the_watchdogs_token_writes_only_where_the_webhook_checks_and_only_its_own_events_and_dry_runs(guarded):
    fail = {"spec": {"activeDeadlineSeconds": 0}, "metadata": {"annotations": {job_failure.ANNOTATION: "{}"}}}
    assert "writes only in the namespaces the webhook checks, not in " + guarded.outside in _answer(
        lambda: guarded.batch.patch_namespaced_job("target", guarded.outside, fail, dry_run="All"))
    job = guarded.job(Stolen.suspended(f"probed-{uuid.uuid4().hex[:6]}"))
    probe = job_failure.probe_pod(job)
    assert "creates Pods only as dry runs" in _answer(
        lambda: guarded.core.create_namespaced_pod(guarded.checked, probe))
    assert _answer(lambda: guarded.core.create_namespaced_pod(guarded.checked, probe, dry_run="All")) == "admitted"
    # Pods elsewhere, kube-system among them, are refused even as dry runs.
    assert "not in kube-system" in _answer(lambda: guarded.core.create_namespaced_pod(
        "kube-system", {**probe, "metadata": {**probe["metadata"], "namespace": "kube-system"}}, dry_run="All"))
    forged = {"metadata": {"generateName": "x-", "namespace": guarded.checked}, "reason": "FailedCreate",
              "involvedObject": {"kind": "Job", "namespace": guarded.checked, "name": job["metadata"]["name"]},
              "message": "x", "source": {"component": "job-controller"}, "reportingComponent": "job-controller"}
    assert "records only its own ImageUnavailable Events" in _answer(
        lambda: guarded.core.create_namespaced_event(guarded.checked, forged, dry_run="All"))


# --- the faces refuse to start unguarded ----------------------------------------------------------


def _binding(policy: str, *, name: str | None = None, actions: tuple[str, ...] = ("Deny",)) -> dict:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name or policy}, "spec": {"policyName": policy, "validationActions": list(actions)}}


def _unguarded_states(policy: dict, other_policy: str) -> list[tuple[list[dict], str]]:
    """What is applied, and the one line the face then exits with."""
    name = policy["metadata"]["name"]
    return [
        ([], f"ValidatingAdmissionPolicy {name} does not exist"),
        ([policy], f"ValidatingAdmissionPolicyBinding {name} does not exist"),
        ([policy, _binding(name, actions=("Warn", "Audit"))],
         f"ValidatingAdmissionPolicyBinding {name} has validationActions [Warn, Audit], without Deny"),
        ([policy, _binding(other_policy, name=name)],
         f"ValidatingAdmissionPolicyBinding {name} binds policy {other_policy}, not {name}"),
    ]


def _refused_to_start(plane, command: list[str], objects: list[dict], names: tuple[str, ...]) -> str:
    _delete(plane, *names)
    if objects:
        _apply(plane, objects)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, (done.returncode, done.stderr)
    (line,) = done.stderr.splitlines()
    return line


def test_the_watchdog_starts_only_while_its_policy_is_bound_with_deny(stolen, tmp_path):
    plane = stolen.plane
    kubeconfig = plane.service_account_kubeconfig("image-preflight", "image-preflight-watchdog",
                                                  tmp_path / "watchdog.kubeconfig")
    # Watching namespaces no test has: the started watchdog acts on nothing.
    extra = ("--write-policy", WATCHDOG_POLICY, "--namespace-selector", "image-preflight.test/none=true")
    command = [sys.executable, "-m", "image_preflight", "watchdog", "--kubeconfig", str(kubeconfig), *extra]
    policy, binding = sorted(_chart_objects({WATCHDOG_POLICY}), key=lambda o: o["kind"])
    for objects, said in _unguarded_states(policy, AGENT_POLICY):
        line = _refused_to_start(plane, command, objects, (WATCHDOG_POLICY,))
        assert line.startswith(f"image-preflight watchdog: {said}"), line
        assert "its token may patch any Job and create Pods in any namespace" in line
    _apply(plane, [policy, binding])
    watchdog = Watchdog(plane, kubeconfig, tmp_path / "watchdog.log", *extra)
    try:
        watchdog.start()  # its /metrics answers: it went past the check
    finally:
        watchdog.stop()
    assert watchdog.popen.returncode == 0, watchdog.tail()
    reads = {(r["resource"], r["verb"], r["code"]) for r in plane.audited_requests(kubeconfig)
             if r["group"] == "admissionregistration.k8s.io"}
    assert reads == {("validatingadmissionpolicies", "get", 404), ("validatingadmissionpolicies", "get", 200),
                     ("validatingadmissionpolicybindings", "get", 404),
                     ("validatingadmissionpolicybindings", "get", 200)}


def test_the_node_agent_starts_only_while_its_policy_is_bound_with_deny(stolen, tmp_path):
    """With --publish: the agent's check comes before its first write, before the runtime is asked
    anything, so no runtime runs here (its cycles fail, and --exit-after-failures 0 keeps it up)."""
    plane = stolen.plane
    guarded_values = {"agent": {"nodeRestriction": {"enabled": True}}}
    role = _chart_objects({"image-preflight-agent"}, guarded_values)
    role = [o for o in role if o["kind"] == "ClusterRole"]
    kubeconfig = plane.service_account_kubeconfig("image-preflight-agent", "image-preflight-agent",
                                                  tmp_path / "agent.kubeconfig")
    command = [sys.executable, "-m", "image_preflight", "agent", "--publish", "--node", "policies-node",
               "--cri-endpoint", f"unix://{tmp_path}/absent.sock", "--kubeconfig", str(kubeconfig),
               "--interval", "1", "--lease", "60", "--exit-after-failures", "0", "--write-policy", AGENT_POLICY]
    policy, binding = sorted(_chart_objects({AGENT_POLICY}, guarded_values), key=lambda o: o["kind"])
    _apply(plane, role)  # the read the chart grants with the policy
    try:
        for objects, said in _unguarded_states(policy, WATCHDOG_POLICY):
            line = _refused_to_start(plane, command, objects, (AGENT_POLICY,))
            assert line.startswith(f"image-preflight agent: {said}"), line
            assert "any agent's token may write every node's NodeImages" in line
        _apply(plane, [policy, binding])
        log = tmp_path / "agent.log"
        with open(log, "wb") as out:
            agent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=out, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: agent.poll() is not None or "publishing" in log.read_text(), "the agent starts")
            assert agent.poll() is None, log.read_text()
        finally:
            terminate(agent)
        assert agent.returncode == 0, log.read_text()
    finally:
        _delete(plane, AGENT_POLICY)
        _apply(plane, [o for o in _chart_objects({"image-preflight-agent"}, API_ONLY) if o["kind"] == "ClusterRole"])

