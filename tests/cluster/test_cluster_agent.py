"""Publishing NodeImages objects on the real control plane: the agent, as its own ServiceAccount,
following a real containerd's images (tags added and removed, the sandbox image coming and going,
the runtime restarting or staying away, SIGTERM), and the Publisher's writes through the real
kubernetes client: created, renewed when the lease is due, rewritten on a change, retried on a
conflict and created again once deleted, each request read back from the apiserver's audit log."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from image_preflight.agent.cri import ImageClient
from image_preflight.agent.inventory import CHANGED, CREATE, RENEW
from image_preflight.agent.publisher import Publisher
from image_preflight.agent.runner import Agent
from image_preflight.cli import main
from image_preflight.core.sources.runtime_lists import (
    AGENT_NAMESPACE,
    GROUP,
    PLURAL,
    VERSION,
    format_time,
    image_hashes,
    node_images_from_runtime,
    renewal,
    renewed,
    runtime_object,
)
from tests.agent_cluster import ALPHA, DEADLINE_S, SWE, import_images, wait_listed, wait_until
from tests.agent_helpers import SAMPLE, T0, names_by_id, printed
from tests.containerd import SANDBOX_IMAGE as SANDBOX
from tests.containerd import remove, tag
from tests.controlplane.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def running(cluster) -> Iterator[Callable[..., Agent]]:
    """Starts Agents of the cluster's node in threads; stops and closes them at the end."""
    started: list[tuple[Agent, threading.Event, threading.Thread]] = []

    def start(endpoint: str, *, lease: int = 60, **options) -> Agent:
        options = {"interval": 0.05, "exit_after_failures": 0, **options}
        agent = Agent(ImageClient(endpoint, timeout=2.0), Publisher(cluster.api, cluster.node, lease_seconds=lease),
                      **options)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        started.append((agent, stop, thread))
        return agent

    yield start
    for agent, stop, thread in started:
        stop.set()
        agent.wake()
        thread.join(10)
        agent.images.close()


# -- the publishing agent against a real containerd -----------------------------------------


def test_published_list_follows_tags_added_and_removed(containerd, tmp_path, capsys, cluster, running):
    ids = import_images(containerd, tmp_path, [ALPHA, SWE])
    wait_listed(containerd, 2)
    agent = running(containerd.endpoint)
    wait_until(cluster.stored, "the object is created")
    assert sorted(cluster.all_tags()) == sorted([ALPHA, SWE])

    extra = "docker.io/library/alpha:v2"
    tag(containerd.socket, ALPHA, extra)
    wait_until(lambda: extra in cluster.all_tags(), "the added tag is published")
    remove(containerd.socket, SWE)
    wait_until(lambda: SWE not in cluster.all_tags(), "the removed tag is gone")

    published = cluster.stored()["spec"]["images"]
    # What --print lists now is what the running agent published: the runtime's view.
    assert published == printed(capsys, containerd.endpoint)["spec"]["images"]
    # CRI keeps an image by id after its last name is removed (see test_cri).
    assert names_by_id(published) == {ids[ALPHA]: (sorted([ALPHA, extra]), []), ids[SWE]: ([], [])}
    assert cluster.writes() == ["create", "update", "update"]
    assert agent.cri_failures == 0


def test_the_published_sandbox_image_follows_the_runtime_and_is_warned_about_once_each_way(
    containerd, tmp_path, cluster, running, caplog
):
    caplog.set_level(logging.INFO, logger="image_preflight.agent")
    agent = running(containerd.endpoint)
    wait_until(cluster.stored, "the object is created")
    assert cluster.stored()["spec"]["sandboxImage"] == {"name": SANDBOX, "present": False}
    cycles = agent.cycles
    wait_until(lambda: agent.cycles >= cycles + 5, "five more cycles")

    ids = import_images(containerd, tmp_path, [SANDBOX])
    wait_until(lambda: cluster.stored()["spec"]["sandboxImage"]["present"], "the sandbox image is reported present")
    remove(containerd.socket, SANDBOX)
    wait_until(lambda: not cluster.stored()["spec"]["sandboxImage"]["present"], "it is reported absent again")
    # CRI still lists the image by id; by name, the runtime cannot find it.
    assert list(names_by_id(cluster.stored()["spec"]["images"])) == [ids[SANDBOX]]

    messages = [r.getMessage() for r in caplog.records if "sandbox image" in r.getMessage()]
    absent = (f"sandbox image {SANDBOX} is not on the runtime at {containerd.endpoint}: every pod sandbox needs it,"
              " so unless the runtime can pull it, pods here wait in ContainerCreating (FailedCreatePodSandBox)")
    assert messages == [absent, f"sandbox image {SANDBOX} is on the runtime again", absent]
    assert [r.levelno for r in caplog.records if "sandbox image" in r.getMessage()] == [
        logging.WARNING, logging.INFO, logging.WARNING]


def test_agent_recovers_after_containerd_restarts_and_leaves_the_object_alone_meanwhile(
    containerd, tmp_path, cluster, running
):
    ids = import_images(containerd, tmp_path, [ALPHA])
    wait_listed(containerd, 1)
    clock = Clock()
    agent = running(containerd.endpoint, lease=30, clock=clock)
    wait_until(cluster.stored, "the object is created")
    version = cluster.stored()["metadata"]["resourceVersion"]

    containerd.stop()
    wait_until(lambda: agent.cri_failures >= 1, "the agent notices the runtime is gone")
    clock.now = T0 + 29  # the lease is due for renewal, but there is no list to renew with
    failures = agent.cri_failures
    wait_until(lambda: agent.cri_failures >= failures + 2, "two more cycles fail")
    assert cluster.stored()["metadata"]["resourceVersion"] == version

    containerd.start()
    wait_until(lambda: cluster.stored()["metadata"]["resourceVersion"] != version, "the lease is renewed")
    assert agent.cri_failures == 0
    assert cluster.stored()["spec"]["observedAt"] == format_time(T0 + 29)
    tag(containerd.socket, ALPHA, "docker.io/library/alpha:after-restart")
    wait_until(lambda: "docker.io/library/alpha:after-restart" in cluster.all_tags(),
               "changes after the restart are published")
    assert list(names_by_id(cluster.stored()["spec"]["images"])) == [ids[ALPHA]]


def test_agent_gives_up_when_the_runtime_stays_away(tmp_path, cluster):
    agent = Agent(ImageClient(str(tmp_path / "absent.sock"), timeout=1.0),
                  Publisher(cluster.api, cluster.node, lease_seconds=30), interval=0.01, exit_after_failures=3)
    with agent.images:
        assert agent.run(threading.Event()) is False
    assert agent.cri_failures == 3
    assert cluster.stored() is None and cluster.requests() == []
    counted = agent.metrics.registry.get_sample_value
    assert [counted("image_preflight_agent_cycles_total", {"outcome": outcome})
            for outcome in ("listed", "runtime_unavailable", "publish_failed")] == [0, 3, 0]


def test_publish_command_exits_1_when_the_runtime_stays_away(tmp_path, cluster, capsys):
    code = main(["agent", "--publish", "--node", cluster.node, "--cri-endpoint", str(tmp_path / "absent.sock"),
                 "--kubeconfig", str(cluster.kubeconfig), "--interval", "0.01", "--exit-after-failures", "2"])
    assert code == 1
    assert cluster.stored() is None


def test_sigterm_stops_the_publishing_agent_cleanly(containerd, tmp_path, cluster):
    import_images(containerd, tmp_path, [ALPHA])
    wait_listed(containerd, 1)
    agent = subprocess.Popen(
        [sys.executable, "-m", "image_preflight", "agent", "--publish", "--cri-endpoint", containerd.endpoint,
         "--kubeconfig", str(cluster.kubeconfig), "--interval", "0.2",
         "--metrics-port", str(port := free_port()), "--host", "127.0.0.1"],
        cwd=ROOT, env={**os.environ, "NODE_NAME": cluster.node}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: cluster.stored() or agent.poll() is not None, "the agent publishes")
        # What the chart's probes and an alert on a silent node read.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            metrics = {(sample.name, sample.labels.get("outcome")): sample.value
                       for family in text_string_to_metric_families(response.read().decode())
                       for sample in family.samples}
        assert metrics["image_preflight_agent_cycles_total", "listed"] >= 1
        assert metrics["image_preflight_agent_cycles_total", "runtime_unavailable"] == 0
        assert metrics["image_preflight_agent_images", None] == len(cluster.stored()["spec"]["images"])
        assert metrics["image_preflight_agent_last_published_timestamp_seconds", None] > 0
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=DEADLINE_S)
    finally:
        agent.kill()
    assert agent.returncode == 0, err
    assert "stopped" in err and out == ""
    assert cluster.all_tags() == [ALPHA]


# -- publishing through the real kubernetes client ------------------------------------------


@pytest.fixture
def publisher(cluster) -> Publisher:
    return Publisher(cluster.api, cluster.node, lease_seconds=30)


def test_first_publish_creates_the_object_named_after_the_node(cluster, publisher):
    assert publisher.publish(SAMPLE, now=T0) == CREATE
    obj = cluster.stored()
    assert obj["metadata"]["name"] == cluster.node
    assert obj["spec"] == {"nodeName": cluster.node, "observedAt": format_time(T0), "leaseDurationSeconds": 30,
                           "images": SAMPLE, "imageCount": 2}
    assert cluster.requests() == [("get", 404), ("create", 201)]


def test_unchanged_images_are_not_rewritten_until_the_lease_is_due(cluster, publisher):
    publisher.publish(SAMPLE, now=T0)
    version = cluster.stored()["metadata"]["resourceVersion"]
    reordered = [dict(i, repoTags=list(reversed(i["repoTags"]))) for i in reversed(SAMPLE)]
    for now in (T0 + 1, T0 + 10, T0 + 19.9):
        assert publisher.publish(reordered, now=now) is None
    assert cluster.stored()["metadata"]["resourceVersion"] == version
    assert cluster.writes() == ["create"]

    # Less than a third of the 30 s lease left: renewed, with the new observation time.
    assert publisher.publish(SAMPLE, now=T0 + 20) == RENEW
    obj = cluster.stored()
    assert obj["metadata"]["resourceVersion"] != version
    assert obj["spec"]["observedAt"] == format_time(T0 + 20)
    assert cluster.writes() == ["create", "update"]


def test_an_added_tag_rewrites_the_object(cluster, publisher):
    publisher.publish(SAMPLE, now=T0)
    changed = [dict(SAMPLE[0], repoTags=[ALPHA, "docker.io/library/alpha:v2"]), SAMPLE[1]]
    assert publisher.publish(changed, now=T0 + 1) == CHANGED
    assert cluster.stored()["spec"]["images"] == changed
    assert cluster.stored()["spec"]["observedAt"] == format_time(T0 + 1)


def test_a_conflicting_write_is_read_again_and_retried(cluster, publisher):
    publisher.publish(SAMPLE, now=T0)
    # Someone else writes the object, so the publisher's resourceVersion is stale.
    other = cluster.stored()
    other["spec"]["images"] = SAMPLE[:1]
    k8s.CustomObjectsApi(cluster.plane.core().api_client).replace_cluster_custom_object(
        GROUP, VERSION, PLURAL, cluster.node, other)

    assert publisher.publish(SAMPLE[1:], now=T0 + 1) == CHANGED
    assert cluster.stored()["spec"]["images"] == SAMPLE[1:]
    assert cluster.requests() == [("get", 404), ("create", 201), ("update", 409), ("get", 200), ("update", 200)]


def test_a_deleted_object_is_created_again(cluster, publisher):
    publisher.publish(SAMPLE, now=T0)
    k8s.CustomObjectsApi(cluster.plane.core().api_client).delete_cluster_custom_object(
        GROUP, VERSION, PLURAL, cluster.node)
    assert publisher.publish(SAMPLE[:1], now=T0 + 1) == CREATE
    assert cluster.stored()["spec"]["images"] == SAMPLE[:1]
    assert cluster.writes() == ["create", "update", "create"]


def test_an_object_from_a_previous_run_is_taken_over_without_a_write(cluster):
    Publisher(cluster.api, cluster.node, lease_seconds=30).publish(SAMPLE, now=T0)
    restarted = Publisher(cluster.api, cluster.node, lease_seconds=30)
    assert restarted.publish(SAMPLE, now=T0 + 5) is None
    assert cluster.writes() == ["create"]
    # A different lease is written at once: readers must use the one the agent keeps.
    assert Publisher(cluster.api, cluster.node, lease_seconds=60).publish(SAMPLE, now=T0 + 6) == RENEW


def test_a_hashed_list_is_written_when_it_changes_and_read_back_as_the_listed_one(cluster):
    hashed = Publisher(cluster.api, cluster.node, lease_seconds=30, hashed=True)
    assert hashed.publish(SAMPLE, now=T0) == CREATE
    spec = cluster.stored()["spec"]
    assert "images" not in spec and spec["imageHashes"] == image_hashes(SAMPLE) and spec["imageCount"] == 2
    for now in (T0 + 1, T0 + 19.9):
        assert hashed.publish(SAMPLE, now=now) is None
    assert hashed.publish(SAMPLE[:1], now=T0 + 20) == CHANGED
    # Renewed through the node's Lease (KEP-589): the list is not written again.
    assert hashed.publish(SAMPLE[:1], now=T0 + 40) == RENEW
    assert hashed.publish(SAMPLE[:1], now=T0 + 59.9) is None
    assert hashed.publish(SAMPLE[:1], now=T0 + 60) == RENEW
    assert cluster.writes() == ["create", "update"]
    assert cluster.stored()["spec"]["observedAt"] == format_time(T0 + 20)
    leases = [(r["verb"], r["code"]) for r in cluster.plane.audited_requests(cluster.kubeconfig)
              if r["resource"] == "leases"]
    assert leases == [("get", 404), ("create", 201), ("update", 200)]
    lease = k8s.CoordinationV1Api(cluster.plane.core().api_client).read_namespaced_lease(cluster.node, AGENT_NAMESPACE)
    assert renewal(cluster.plane.core().api_client.sanitize_for_serialization(lease)) == (cluster.node, T0 + 60)
    read = node_images_from_runtime(cluster.stored())
    assert not read.current(T0 + 60 + 1) and renewed(read, T0 + 60).current(T0 + 60 + 29)
    listed = node_images_from_runtime(runtime_object(cluster.node, SAMPLE[:1], observed_at=T0, lease_seconds=30))
    for name in (ALPHA, SWE):
        assert read.holds(name) is listed.holds(name)
    assert read.holds(ALPHA)

    # Switching forms rewrites the object at once, either way.
    assert Publisher(cluster.api, cluster.node, lease_seconds=30).publish(SAMPLE[:1], now=T0 + 41) == CHANGED
    assert "imageHashes" not in cluster.stored()["spec"] and cluster.stored()["spec"]["images"] == SAMPLE[:1]
    assert Publisher(cluster.api, cluster.node, lease_seconds=30, hashed=True).publish(SAMPLE[:1], now=T0 + 42) \
        == CHANGED
    assert "images" not in cluster.stored()["spec"]


@pytest.mark.parametrize("spec", [
    {"images": SAMPLE, "imageHashes": image_hashes(SAMPLE)},  # both
    {},  # neither
    {"imageHashes": {**image_hashes(SAMPLE), "algorithm": "sha1"}},
    {"imageHashes": {**image_hashes(SAMPLE), "count": 100_001}},
])
def test_the_crd_refuses_an_object_with_both_forms_neither_or_a_bad_one(cluster, spec):
    body = runtime_object(cluster.node, SAMPLE, observed_at=T0, lease_seconds=30)
    del body["spec"]["images"]
    body["spec"].update(spec)
    with pytest.raises(ApiException) as refused:
        k8s.CustomObjectsApi(cluster.plane.core().api_client).create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    assert refused.value.status == 422


def test_the_agents_token_may_not_list_watch_patch_or_delete_node_lists(cluster, publisher):
    """Issue: the agent's role granted list, watch and patch, which it never calls; a stolen token
    could read every node's list or rewrite another's by patch."""
    publisher.publish(SAMPLE, now=T0)
    custom = k8s.CustomObjectsApi(cluster.api)
    for call in (lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL),
                 lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, watch=True, timeout_seconds=1),
                 lambda: custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, cluster.node,
                                                            {"spec": {"images": []}}),
                 lambda: custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, cluster.node)):
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 403
    assert cluster.stored()["spec"]["images"]  # nothing was changed
