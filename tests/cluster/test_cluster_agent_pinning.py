"""The agent pinning what the needed-images ConfigMap names, on the real control plane as its own
ServiceAccount: it follows the list's changes through a real watch, survives a restart without
pinning or unpinning anything, leaves an operator's pin alone, says once that a runtime which
cannot pin (Debian's containerd 1.6) cannot and goes on listing (which doctor then reports), and
may read that one ConfigMap and no other."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.agent.containerd_images import ImageRecords
from image_preflight.agent.cri import ImageClient
from image_preflight.agent.pinner import Pinner
from image_preflight.agent.publisher import Publisher
from image_preflight.agent.runner import Agent
from image_preflight.core.image_gc.pinning import NEEDED_NAME, NEEDED_NAMESPACE, PINNED_LABEL, PINNED_VALUE
from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION
from image_preflight.doctor.command import check
from image_preflight.kube.needed_images import needed_images_watcher
from tests.agent_cluster import ALPHA, wait_until
from tests.agent_helpers import BETA, GAMMA, SOURCE, import_images, labels_of
from tests.containerd import Containerd

# -- the agent with a real apiserver ----------------------------------------------------------


class Cluster:
    """The apiserver as the agent's ServiceAccount (`api`) and as admin; one node of this test."""

    def __init__(self, plane, node: str, api: k8s.ApiClient) -> None:
        self.plane, self.node, self.api = plane, node, api
        self.core = plane.core()

    def spec(self) -> dict | None:
        try:
            return k8s.CustomObjectsApi(self.core.api_client).get_cluster_custom_object(
                GROUP, VERSION, PLURAL, self.node)["spec"]
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pinned(self) -> set[str]:
        spec = self.spec() or {"images": []}
        return {name for i in spec["images"] if i.get("pinned") for name in i["repoTags"]}

    def write_list(self, **files: str) -> None:
        body = {"metadata": {"name": NEEDED_NAME}, "data": files}
        try:
            self.core.replace_namespaced_config_map(NEEDED_NAME, NEEDED_NAMESPACE, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.core.create_namespaced_config_map(NEEDED_NAMESPACE, body)

    def delete_list(self) -> None:
        try:
            self.core.delete_namespaced_config_map(NEEDED_NAME, NEEDED_NAMESPACE)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def cluster(service_accounts, case, tmp_path) -> Iterator[Cluster]:
    kubeconfig = service_accounts.service_account_kubeconfig("image-preflight-agent", "image-preflight-agent",
                                                             tmp_path / "agent.kubeconfig")
    api = service_accounts.api_client(kubeconfig)
    found = Cluster(service_accounts, case.name("pin-node"), api)
    found.delete_list()
    yield found
    found.delete_list()
    api.close()


@pytest.fixture
def agents(cluster) -> Iterator[Callable[[Containerd], Agent]]:
    """Starts pinning Agents with their ConfigMap watch in threads; stops them at the end."""
    running: list[tuple[Agent, threading.Event, threading.Thread, object]] = []

    def start(runtime: Containerd, max_bytes: int | None = None) -> Agent:
        pinner = Pinner(ImageRecords(runtime.endpoint), SOURCE, max_bytes=max_bytes)
        agent = Agent(ImageClient(runtime.endpoint, timeout=2.0),
                      Publisher(cluster.api, cluster.node, lease_seconds=60),
                      interval=0.2, exit_after_failures=0, pinner=pinner)
        watcher = needed_images_watcher(cluster.api, SOURCE, lambda cm: (pinner.set_list(cm), agent.wake()))
        watcher.start()
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        running.append((agent, stop, thread, watcher))
        return agent

    def stop_all() -> None:
        while running:
            agent, stop, thread, watcher = running.pop()
            stop.set()
            agent.wake()
            thread.join(10)
            watcher.stop()
            agent.images.close()
            agent.pinner.records.close()

    start.stop_all = stop_all  # type: ignore[attr-defined]  # the fixture hands its stopper out on the function
    yield start
    stop_all()


def test_the_agent_pins_what_the_list_names_follows_its_changes_and_survives_a_restart(
    containerd2, tmp_path, cluster, agents, caplog
):
    caplog.set_level(logging.INFO, logger="image_preflight.agent")
    import_images(containerd2, tmp_path, [ALPHA, BETA])
    subprocess.run([containerd2.ctr, "-a", containerd2.socket, "-n", "k8s.io", "images", "label", BETA,
                    f"{PINNED_LABEL}={PINNED_VALUE}"], check=True, capture_output=True)  # an operator's pin
    cluster.write_list(**{"train.txt": "alpha:v1\ngamma:v1\n", "val.txt": "beta:v1\n"})
    agent = agents(containerd2)
    wait_until(lambda: cluster.pinned() == {ALPHA, BETA}, "alpha is pinned")
    wait_until(lambda: cluster.spec()["pinning"] == {"list": SOURCE, "supported": True, "needed": 2, "pinned": 2},
               "spec.pinning counts both")

    import_images(containerd2, tmp_path, [GAMMA])  # a needed image arriving later is pinned on its event
    wait_until(lambda: GAMMA in cluster.pinned(), "gamma is pinned", timeout_s=5)
    assert agent.pinner.pinned == 2

    agents.stop_all()  # a restart pins and unpins nothing: the marks are in containerd
    restarted = agents(containerd2)
    wait_until(lambda: restarted.cycles >= 3, "three cycles of the restarted agent")
    assert (restarted.pinner.pinned, restarted.pinner.unpinned) == (0, 0)

    cluster.write_list(**{"train.txt": "gamma:v1\n", "val.txt": "beta:v1\n"})
    wait_until(lambda: cluster.pinned() == {BETA, GAMMA}, "alpha is unpinned")
    cluster.delete_list()
    wait_until(lambda: cluster.pinned() == {BETA}, "only the operator's pin stays")
    assert labels_of(containerd2, BETA) == {"io.cri-containerd.image": "managed", PINNED_LABEL: PINNED_VALUE}
    wait_until(lambda: cluster.spec()["pinning"] == {"list": SOURCE, "supported": True, "needed": 0, "pinned": 0},
               "spec.pinning counts none")
    logged = [r.getMessage() for r in caplog.records]
    assert f"unpinned {ALPHA} (no longer in configmap {SOURCE})" in logged


def test_a_needed_list_over_the_byte_cap_pins_what_fits_and_reports_the_rest(containerd2, tmp_path, cluster, agents):
    """Issue: whoever writes the needed list could pin every image and stop image GC until the disk
    fills. With --pin-max-bytes the rest stays collectable, and spec.pinning says so."""
    import_images(containerd2, tmp_path, [ALPHA, BETA])
    client = ImageClient(containerd2.endpoint)
    sizes = {tag: image.size for image in client.list_images() for tag in image.repo_tags if tag in (ALPHA, BETA)}
    client.close()
    cluster.write_list(**{"train.txt": "alpha:v1\nbeta:v1\n"})
    agents(containerd2, max_bytes=max(sizes.values()))  # room for one of the two
    wait_until(lambda: len(cluster.pinned()) == 1, "one image is pinned")
    (kept,) = cluster.pinned()
    left = ({ALPHA, BETA} - {kept}).pop()
    wait_until(lambda: (cluster.spec().get("pinning") or {}).get("refused"), "spec.pinning reports the refusal")
    pinning = cluster.spec()["pinning"]
    assert (pinning["needed"], pinning["pinned"], pinning["refused"]) == (2, 1, 1)
    assert f"1 needed image(s) not pinned ({left}): pinning them would pass --pin-max-bytes" in pinning["message"]


def test_a_runtime_that_cannot_pin_is_said_once_and_listing_goes_on(containerd, tmp_path, cluster, agents, case,
                                                                     caplog):
    caplog.set_level(logging.INFO, logger="image_preflight.agent")
    case.node("pin-node")  # the Node the object speaks for, for doctor
    import_images(containerd, tmp_path, [ALPHA])
    cluster.write_list(**{"needed.txt": "alpha:v1\n"})
    agent = agents(containerd)  # Debian's containerd 1.6.20
    wait_until(lambda: (cluster.spec() or {}).get("pinning", {}).get("needed") == 1, "the report")
    pinning = cluster.spec()["pinning"]
    assert pinning["supported"] is False and pinning["pinned"] == 0
    assert "does not take in a pinned label" in pinning["message"]
    cycles = agent.cycles
    wait_until(lambda: agent.cycles >= cycles + 5, "five more cycles")
    import_images(containerd, tmp_path, [BETA])
    wait_until(lambda: BETA in {n for i in cluster.spec()["images"] for n in i["repoTags"]}, "beta is listed")
    said = [r for r in caplog.records if "cannot pin" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert agent.pinner.pinned == 0 and PINNED_LABEL not in labels_of(containerd, ALPHA)
    # doctor reads it from the object: the node's runtime cannot pin, and the needed image it holds is at risk.
    found = check(cluster.core.api_client, rollouts="default", webhook_address=None, max_images=50, node_selector={},
                  now=time.time())
    line = next(f.line() for f in found if f.text.startswith(f"node {cluster.node}: its container runtime cannot pin"))
    assert line.startswith("problem: ") and pinning["message"] in line and ALPHA in line, line


def test_the_agent_may_read_the_needed_list_and_no_other_configmap(cluster):
    cluster.write_list(**{"needed.txt": "alpha:v1\n"})
    core = k8s.CoreV1Api(cluster.api)
    assert core.read_namespaced_config_map(NEEDED_NAME, NEEDED_NAMESPACE).data == {"needed.txt": "alpha:v1\n"}
    assert len(core.list_namespaced_config_map(NEEDED_NAMESPACE, field_selector=f"metadata.name={NEEDED_NAME}")
               .items) == 1
    for call in (lambda: core.list_namespaced_config_map(NEEDED_NAMESPACE),
                 lambda: core.read_namespaced_config_map("kube-root-ca.crt", NEEDED_NAMESPACE),
                 lambda: core.replace_namespaced_config_map(NEEDED_NAME, NEEDED_NAMESPACE,
                                                            {"metadata": {"name": NEEDED_NAME}, "data": {}})):
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 403
