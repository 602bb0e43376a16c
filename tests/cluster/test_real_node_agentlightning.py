"""agent-lightning as it really runs, on the real node: its own `agl-server` and `agl-controller`
(agentlightning 1.0.2 from .venv-agl, runner_type=k8s, the settings examples/swe_smith/run.sh
gives them), rollouts enqueued over the server's REST API as its VERL rollout manager does
(agentlightning/verl/agl_rollout_manager.py, _create_rollouts: the row as `input`, the template's
text in `config.k8s.job_template`), with deploy/ and the webhook and watchdog of tests/cluster/test_real_node.py.

The controller acts as a ServiceAccount of its own, allowed Jobs in its namespace and nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from image_preflight.core.watchdog import job_failure
from tests.agent_lightning import TEMPLATE, VENV, example_row, require_agent_lightning
from tests.builders.rows import example_row_id
from tests.builders.stalls import ENFORCE_LABEL
from tests.chart import merged
from tests.cluster.real_stack import ABSENT, DENIED, GRACE_S, HELD, apply_without_pods
from tests.controlplane.cluster import free_port, terminate, wait_for
from tests.needs import record_figures

KEY = "dummy"  # run.sh's AGL_KEY default
POLL_S = 5.0  # agl-controller's k8s_runner.poll_interval default, as run.sh leaves it
FIGURES: dict[str, float] = {}


class AgentLightning:
    """agl-server on loopback and agl-controller for one namespace, as run.sh starts them."""

    def __init__(self, stack, namespace: str, folder: Path) -> None:
        self.stack, self.namespace, self.folder = stack, namespace, folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen | None = None
        self.controller: subprocess.Popen | None = None

    def start(self) -> None:
        plane = self.stack.plane
        core = plane.core()
        core.create_namespaced_service_account(self.namespace, {"metadata": {"name": "agl-controller"}})
        # What the controller uses (controller/k8s_reconciler.py: list and watch its managed Jobs,
        # create them), in its namespace only.
        plane.kubectl("-n", self.namespace, "create", "role", "agl-controller", "--verb=get,list,watch,create,delete",
                      "--resource=jobs.batch")
        plane.kubectl("-n", self.namespace, "create", "rolebinding", "agl-controller", "--role=agl-controller",
                      f"--serviceaccount={self.namespace}:agl-controller")
        kubeconfig = plane.service_account_kubeconfig(self.namespace, "agl-controller",
                                                      self.folder / "controller.kubeconfig")
        self.server = self._run("agl-server", ["host=127.0.0.1", f"port={self.port}", f"key={KEY}",
                                               f"hydra.run.dir={self.folder / 'hydra-server'}"], {})
        wait_for(self._healthy, "agl-server answers", timeout_s=60, interval_s=0.2)
        self.controller = self._run("agl-controller", [
            "runner_type=k8s", f"agl_server.url={self.url}", f"agl_server.key={KEY}",
            f"k8s_runner.namespace={self.namespace}", "k8s_runner.ttl_after_finished=600",
            f"hydra.run.dir={self.folder / 'hydra-controller'}"], {"KUBECONFIG": str(kubeconfig)})

    def _run(self, command: str, args: list[str], env: dict) -> subprocess.Popen:
        log = open(self.folder / f"{command}.log", "ab")
        return subprocess.Popen([str(VENV / "bin" / command), *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.folder, env={**os.environ, **env})

    def stop(self) -> None:
        for popen in (self.controller, self.server):
            terminate(popen)  # the controller's watch notices SIGTERM only at its next event; 15 s, then KILL

    def _healthy(self) -> bool:
        assert self.server is not None
        if self.server.poll() is not None:
            raise RuntimeError(f"agl-server exited {self.server.returncode}:\n{self.tail('agl-server')}")
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def tail(self, command: str = "agl-controller") -> str:
        return "\n".join((self.folder / f"{command}.log").read_text(errors="replace").splitlines()[-30:])

    def _call(self, method: str, path: str, body=None):
        request = urllib.request.Request(self.url + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    def enqueue(self, images: list[str], *, timeout_seconds: int = 1800) -> list[str]:
        """Rollouts as the trainer creates them: one per row (here, per image), the template's
        text in each rollout's config; their ids."""
        template = TEMPLATE.read_text()
        base = example_row(example_row_id())
        rollouts = [{"rollout_id": uuid.uuid4().hex[:12], "is_train": True,
                     "input": dict(base, image_name=image.removesuffix(":openai")),
                     "config": {"timeout_seconds": timeout_seconds, "k8s": {"job_template": template}}}
                    for image in images]
        self._call("POST", "/api/rollouts", rollouts)
        return [r["rollout_id"] for r in rollouts]

    def status(self, rollout_id: str) -> dict:
        return self._call("GET", f"/api/rollouts/{rollout_id}")["rollout"]["status"]

    def wait_state(self, rollout_id: str, states: set[str], timeout_s: float) -> dict:
        try:
            return wait_for(lambda: (s := self.status(rollout_id))["state"] in states and s,
                            f"rollout {rollout_id} in {states}", timeout_s=timeout_s, interval_s=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.status(rollout_id)}\n{self.tail()}") from None


@pytest.fixture(scope="module")
def agl(stack, tmp_path_factory):
    require_agent_lightning()
    namespace = stack.namespace()  # opted in, with the template's ConfigMap
    started = AgentLightning(stack, namespace, tmp_path_factory.mktemp("agent-lightning"))
    try:
        started.start()
        yield started
    finally:
        started.stop()
    record_figures(FIGURES)


def _jobs(agl) -> list:
    return agl.stack.batch.list_namespaced_job(
        agl.namespace, label_selector="app.kubernetes.io/managed-by=agentlightning").items


def _jobs_of(agl, rollout: str) -> list:
    """The rollout's Jobs, by agent-lightning's label (its status may no longer name the Job)."""
    return agl.stack.batch.list_namespaced_job(
        agl.namespace, label_selector=f"agentlightning/rollout-id={rollout}").items


def test_a_held_image_runs_on_the_real_node_and_the_rollout_succeeds(agl):
    (rollout,) = agl.enqueue([HELD])
    agl.wait_state(rollout, {"running", "succeeded"}, timeout_s=POLL_S + 30)
    status = agl.wait_state(rollout, {"succeeded", "failed"}, timeout_s=90)
    assert status["state"] == "succeeded", status
    (pod,) = agl.stack.pods(agl.namespace, _jobs_of(agl, rollout)[0].metadata.name)
    assert pod.spec.node_name == agl.stack.node.name


def test_an_absent_image_fails_the_rollout_within_one_poll_with_our_words_and_no_job(agl):
    before = {j.metadata.name for j in _jobs(agl)}
    start = time.monotonic()
    (rollout,) = agl.enqueue([ABSENT])
    status = agl.wait_state(rollout, {"failed", "running", "succeeded"}, timeout_s=POLL_S * 3)
    FIGURES["enqueue to FAILED, webhook"] = time.monotonic() - start
    assert status["state"] == "failed", status
    # k8s_reconciler.py: "Invalid Job spec: " + kr8s's text, the apiserver's message alone.
    assert DENIED in status["error_message"] and ABSENT in status["error_message"], status
    assert FIGURES["enqueue to FAILED, webhook"] < POLL_S + 3
    assert {j.metadata.name for j in _jobs(agl)} == before


def test_with_the_webhook_unreachable_the_watchdog_fails_the_job_and_the_rollout(agl):
    """failurePolicy Ignore admits the Job; the kubelet's ErrImagePull, the watchdog's deadline,
    the Job controller's Failed, and agent-lightning's watch marks the rollout failed."""
    with agl.stack.webhook_unreachable():
        start = time.monotonic()
        (rollout,) = agl.enqueue([ABSENT])
        status = agl.wait_state(rollout, {"failed", "succeeded"}, timeout_s=POLL_S + GRACE_S + 60)
    FIGURES["enqueue to FAILED, watchdog (grace 3 s)"] = time.monotonic() - start
    # "Job failed" from agent-lightning's poll, on status.failed > 0, which the Job controller sets
    # while FailureTarget stands, before Failed; "Job failed: DeadlineExceeded" from its watch, on Failed.
    assert status["state"] == "failed" and status["error_message"].startswith("Job failed"), status
    (job,) = _jobs_of(agl, rollout)
    assert job_failure.ANNOTATION in (job.metadata.annotations or {})
    # Far inside the rollout's own 1,800 s; the slack is the Pod's sandbox start and first pull on
    # a loaded two-core machine, where 28.9 s has been seen.
    assert FIGURES["enqueue to FAILED, watchdog (grace 3 s)"] < POLL_S + GRACE_S + 30


def test_without_image_preflight_the_rollout_stays_running_in_image_pull_back_off(agl):
    """The namespace opted out: neither the webhook nor the watchdog looks. The rollout waits
    until its own timeout (30 s here; the seed's 1,800 s)."""
    core = agl.stack.core
    core.patch_namespace(agl.namespace, {"metadata": {"labels": {key: None for key in ENFORCE_LABEL}}})
    try:
        wait_for(lambda: agl.stack.dry_run(agl.namespace, ABSENT)[0] == 0, "the webhook no longer called")
        (rollout,) = agl.enqueue([ABSENT], timeout_seconds=30)
        status = agl.wait_state(rollout, {"running", "failed"}, timeout_s=POLL_S * 3)
        assert status["state"] == "running", status
        name = _jobs_of(agl, rollout)[0].metadata.name
        wait_for(lambda: "ImagePullBackOff" in agl.stack.waiting_reasons(agl.namespace, name),
                 "the Pod in ImagePullBackOff", timeout_s=40)
        assert agl.status(rollout)["state"] == "running"
        status = agl.wait_state(rollout, {"failed", "succeeded"}, timeout_s=60)
        assert status["state"] == "failed" and status["error_message"].startswith("Job failed"), status
        (job,) = _jobs_of(agl, rollout)
        assert job_failure.ANNOTATION not in (job.metadata.annotations or {})  # its own deadline, not ours
    finally:
        core.patch_namespace(agl.namespace, {"metadata": {"labels": ENFORCE_LABEL}})


def test_a_batch_as_the_trainer_sends_it_fails_every_bad_rows_rollouts_and_runs_the_good(agl):
    """rollout.n = 2 attempts of three rows at once, one of them naming an absent image."""
    rows = [HELD, ABSENT, HELD]
    ids = agl.enqueue([image for image in rows for _ in range(2)])
    states = {rollout: agl.wait_state(rollout, {"running", "failed", "succeeded"}, timeout_s=POLL_S * 4)["state"]
              for rollout in ids}
    for index, rollout in enumerate(ids):
        expected = {"failed"} if rows[index // 2] == ABSENT else {"running", "succeeded"}
        assert states[rollout] in expected, (rows[index // 2], states)
    for index, rollout in enumerate(ids):
        if rows[index // 2] == HELD:
            assert agl.wait_state(rollout, {"succeeded", "failed"}, timeout_s=120)["state"] == "succeeded"


def test_under_failure_policy_fail_an_unreachable_webhook_leaves_the_rollout_queuing(agl):
    """webhook.failurePolicy Fail, the webhook unreachable: the apiserver refuses the Job with an
    internal error that names no "invalid", so agent-lightning retries it every poll, for ever
    (k8s_reconciler.py), with no Job for the watchdog to fail. Why the chart keeps Ignore."""
    plane = agl.stack.plane
    apply_without_pods(plane, merged(agl.stack.values, {"webhook": {"failurePolicy": "Fail"}}))
    try:
        with agl.stack.webhook_unreachable():
            wait_for(lambda: "failed calling webhook" in agl.stack.dry_run(agl.namespace, HELD)[1],
                     "the apiserver fails closed")
            (rollout,) = agl.enqueue([HELD])
            time.sleep(POLL_S * 3)
            assert agl.status(rollout)["state"] == "queuing"
            assert not _jobs_of(agl, rollout)
            assert "will retry" in (agl.folder / "agl-controller.log").read_text(errors="replace")
    finally:
        apply_without_pods(plane, agl.stack.values)
    # Once the webhook answers again the rollout's next poll creates its Job.
    agl.wait_state(rollout, {"running", "succeeded"}, timeout_s=POLL_S * 3)
