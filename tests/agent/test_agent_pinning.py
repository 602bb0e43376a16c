"""The agent's pinning: the plan (pure), containerd's images API (real containerd 2.x and 1.6),
and the agent following a real ConfigMap through a real apiserver as its own ServiceAccount.

Upstream: the kubelet's image GC skips what CRI reports pinned (pkg/kubelet/images/
image_gc_manager.go, imagesInEvictionOrder); containerd's CRI reports an image pinned when any of
its records carries io.cri-containerd.pinned=pinned (internal/cri/store/image/image.go,
Store.getImage and store.add), and takes in a label change from the /images/update event
(internal/cri/server/events.go, Store.update with store.pin/unpin).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.agent.containerd_images import ImageRecords
from image_preflight.agent.cri import ImageClient
from image_preflight.agent.inventory import image_dicts
from image_preflight.agent.pinner import Pinner
from image_preflight.agent.publisher import Agent, Publisher
from image_preflight.cli import main
from image_preflight.doctor.command import check
from image_preflight.core.image_gc.pinning import (
    MARK_LABEL, MARK_VALUE, NEEDED_NAME, NEEDED_NAMESPACE, PINNED_LABEL, PINNED_VALUE, NeededImages, PinPlan,
    needed_text, needed_unpinned, parse_needed, pin_plan, pinning_refusal, pinning_report,
)
from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION
from image_preflight.kube.needed_images import needed_images_watcher
from tests.containerd import SANDBOX_IMAGE, Containerd, build_oci_archive_many, containerd2_binary, import_image

DEADLINE_S = 15.0
ALPHA = "docker.io/library/alpha:v1"
BETA = "docker.io/library/beta:v1"
GAMMA = "docker.io/library/gamma:v1"
SOURCE = f"{NEEDED_NAMESPACE}/{NEEDED_NAME}"
A_ID, B_ID = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.02)


def image(image_id: str, *tags: str, digests: tuple[str, ...] = (), pinned: bool = False) -> dict:
    return {"id": image_id, "repoTags": list(tags), "repoDigests": list(digests), "size": 1, "pinned": pinned}


def needed(*refs: str) -> NeededImages:
    return parse_needed({"needed.txt": "".join(f"{ref}\n" for ref in refs)})


# -- the list and the plan (pure) -----------------------------------------------------------


def test_the_list_is_every_key_of_the_configmap_normalised_without_comments_or_blank_lines():
    found = parse_needed({"train.txt": "alpha:v1\n\n# validation rows below\nbeta:v1\n",
                          "val.txt": "docker.io/library/beta:v1\n  gamma:v1  \n"})
    assert found == NeededImages(frozenset({ALPHA, BETA, GAMMA}))
    assert parse_needed(None) == NeededImages(frozenset())


def test_a_bad_line_is_named_by_configmap_key_and_line_and_the_rest_is_kept():
    found = parse_needed({"val.txt": "alpha:v1\nNot/A:Valid:Ref\n", "bin": 7}, "ns/list")
    assert found.keys == {ALPHA}
    assert found.errors[0] == "configmap ns/list key bin: not text"
    assert found.errors[1].startswith("configmap ns/list key val.txt line 2: ")
    assert "\n" not in found.summary


def test_the_needed_file_is_sorted_distinct_runtime_names():
    assert needed_text(["beta:v1", "alpha:v1", "docker.io/library/alpha:v1", "alpha"]) == (
        "docker.io/library/alpha:latest\n" f"{ALPHA}\n{BETA}\n")


@pytest.mark.parametrize(("name", "version", "can"), [
    ("containerd", "v2.4.2", True),
    ("containerd", "2.0.0", True),
    ("containerd", "v1.7.10", True),
    ("containerd", "1.6.25", True),
    ("containerd", "1.6.20~ds1", False),  # Debian bookworm's: pinned support came in 1.6.22
    ("containerd", "v1.6.24", False),  # labels set after load ignored until 1.6.25 (containerd#9382)
    ("containerd", "v1.7.3", False),  # likewise until 1.7.10 (containerd#9381)
    ("containerd", "v1.5.18", False),
    ("containerd", "dev", False),
    ("cri-o", "1.30.0", False),
])
def test_which_runtimes_can_pin(name, version, can):
    refusal = pinning_refusal(name, version)
    assert (refusal is None) == can
    if refusal is not None:
        assert version in refusal and "\n" not in refusal


def test_needed_images_held_here_and_not_pinned_are_pinned_by_the_name_the_runtime_lists():
    images = [image(A_ID, ALPHA), image(B_ID, BETA, pinned=True)]
    plan = pin_plan(needed("alpha:v1", "beta:v1", "gamma:v1"), images, {})
    assert plan.pin == (ALPHA,)  # beta is pinned already (by someone else); gamma is not here
    assert plan.unpin == ()


def test_a_needed_digest_or_image_id_pins_that_record():
    digest = "docker.io/library/alpha@sha256:" + "c" * 64
    images = [image(A_ID, ALPHA, digests=(digest,)), image(B_ID)]
    assert pin_plan(needed(digest, B_ID), images, {}).pin == (digest, B_ID)


def test_what_we_pinned_stays_while_needed_and_is_unpinned_once_unlisted_and_nothing_else_is():
    ours = {PINNED_LABEL: PINNED_VALUE, MARK_LABEL: MARK_VALUE}
    images = [image(A_ID, ALPHA, pinned=True), image(B_ID, BETA, pinned=True)]
    plan = pin_plan(needed("alpha:v1"), images, {ALPHA: ours, BETA: ours})
    assert plan == pin_plan(needed("alpha:v1"), images, {ALPHA: ours, BETA: ours})
    assert (plan.pin, plan.unpin) == ((), (BETA,))
    # An image pinned by another (no mark) and no longer listed is left alone.
    assert pin_plan(needed(), [image(A_ID, ALPHA, pinned=True)], {}).unpin == ()


def test_our_mark_without_the_pin_label_is_pinned_again():
    assert pin_plan(needed("alpha:v1"), [image(A_ID, ALPHA)], {ALPHA: {MARK_LABEL: MARK_VALUE}}).pin == (ALPHA,)


def test_a_list_with_bad_lines_pins_its_good_ones_and_unpins_nothing():
    broken = parse_needed({"needed.txt": "alpha:v1\nNot/A:Valid:Ref\n"})
    ours = {PINNED_LABEL: PINNED_VALUE, MARK_LABEL: MARK_VALUE}
    plan = pin_plan(broken, [image(A_ID, ALPHA), image(B_ID, BETA, pinned=True)], {BETA: ours})
    assert (plan.pin, plan.unpin) == ((ALPHA,), ())


def test_the_report_counts_the_needed_images_held_and_pinned():
    images = [image(A_ID, ALPHA, pinned=True), image(B_ID, BETA)]
    report = pinning_report(source=SOURCE, refusal=None, needed=needed("alpha:v1", "beta:v1", "gamma:v1"),
                            images=images)
    assert report == {"list": SOURCE, "supported": True, "needed": 2, "pinned": 1}
    assert needed_unpinned(needed("alpha:v1", "beta:v1").keys, images) == [BETA]
    refused = pinning_report(source=SOURCE, refusal="containerd 1.6.20 ...", needed=None, images=images)
    assert refused == {"list": SOURCE, "supported": False, "message": "containerd 1.6.20 ..."}


# -- containerd's images API ------------------------------------------------------------------


@pytest.fixture
def containerd2() -> Iterator[Containerd]:
    with Containerd(binary=containerd2_binary()) as runtime:
        yield runtime


def import_images(runtime: Containerd, directory: Path, names: list[str]) -> None:
    archive = directory / f"images-{time.monotonic_ns()}.tar"
    build_oci_archive_many(archive, names)
    import_image(runtime.socket, archive)
    with ImageClient(runtime.endpoint) as cri:
        wait_until(lambda: set(names) <= {n for i in cri.list_images() for n in i.repo_tags}, "CRI lists them")


def labels_of(runtime: Containerd, name: str) -> dict[str, str]:
    rows = subprocess.run([runtime.ctr, "-a", runtime.socket, "-n", "k8s.io", "images", "ls"], capture_output=True,
                          text=True, check=True).stdout.splitlines()[1:]
    for row in rows:
        columns = row.split()
        if columns and columns[0] == name:
            return dict(label.split("=", 1) for label in columns[-1].split(",") if "=" in label)
    raise AssertionError(f"no record {name}")


def pinned_names(runtime: Containerd) -> set[str]:
    with ImageClient(runtime.endpoint) as cri:
        return {name for i in cri.list_images() if i.pinned for name in i.repo_tags}


def test_pin_and_unpin_change_what_cri_reports_and_only_our_labels(containerd2, tmp_path):
    import_images(containerd2, tmp_path, [ALPHA, BETA])
    with ImageRecords(containerd2.endpoint) as records:
        assert records.pin(ALPHA) is True
        # containerd 2.4 crashes on an Update without a target: the runtime still answering is the proof.
        wait_until(lambda: pinned_names(containerd2) == {ALPHA}, "CRI reports alpha pinned")
        assert labels_of(containerd2, ALPHA) == {"io.cri-containerd.image": "managed", PINNED_LABEL: PINNED_VALUE,
                                                 MARK_LABEL: MARK_VALUE}
        assert records.marked() == {ALPHA: labels_of(containerd2, ALPHA)}
        assert records.pin("docker.io/library/absent:v1") is False
        assert records.unpin(ALPHA) is True
        wait_until(lambda: pinned_names(containerd2) == set(), "CRI reports nothing pinned")
        assert labels_of(containerd2, ALPHA) == {"io.cri-containerd.image": "managed"}
        assert records.marked() == {}


def test_a_pin_without_our_mark_is_never_removed(containerd2, tmp_path):
    import_images(containerd2, tmp_path, [ALPHA])
    subprocess.run([containerd2.ctr, "-a", containerd2.socket, "-n", "k8s.io", "images", "label", ALPHA,
                    f"{PINNED_LABEL}={PINNED_VALUE}"], check=True, capture_output=True)
    with ImageRecords(containerd2.endpoint) as records:
        assert records.marked() == {}
        assert records.unpin(ALPHA) is False
    assert labels_of(containerd2, ALPHA)[PINNED_LABEL] == PINNED_VALUE


def test_containerd_pins_its_sandbox_image_itself_and_the_plan_leaves_that_pin_alone(containerd2, tmp_path):
    """containerd 2.x labels the image its config names as the sandbox, imported too
    (internal/cri/server/images/image_pull.go: UpdateImage with getLabels, on the image event)."""
    import_images(containerd2, tmp_path, [SANDBOX_IMAGE, ALPHA])
    wait_until(lambda: pinned_names(containerd2) == {SANDBOX_IMAGE}, "CRI reports the sandbox image pinned")
    with ImageClient(containerd2.endpoint) as cri, ImageRecords(containerd2.endpoint) as records:
        listed = image_dicts(cri.list_images())
        plan = pin_plan(needed(SANDBOX_IMAGE, ALPHA), listed, records.marked())
        assert (plan.pin, plan.unpin) == ((ALPHA,), ())
        assert pin_plan(needed(), listed, records.marked()) == PinPlan((), ())
    assert MARK_LABEL not in labels_of(containerd2, SANDBOX_IMAGE)


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

    def start(runtime: Containerd) -> Agent:
        pinner = Pinner(ImageRecords(runtime.endpoint), SOURCE)
        agent = Agent(ImageClient(runtime.endpoint, timeout=2.0), Publisher(cluster.api, cluster.node, lease_seconds=60),
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
            thread.join(10)
            watcher.stop()
            agent.images.close()
            agent.pinner.records.close()

    start.stop_all = stop_all  # type: ignore[attr-defined]
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


@pytest.mark.parametrize(("argv", "message"), [
    (["--print", "--pin-needed-images", SOURCE], "--pin-needed-images: pins only with --publish"),
    (["--publish", "--pin-needed-images", "needed-images"], "--pin-needed-images: 'needed-images' is not NAMESPACE/NAME"),
])
def test_bad_pinning_flags_are_named(argv, message, capsys):
    assert main(["agent", "--node", "n", *argv]) == 2
    assert capsys.readouterr().err.strip().endswith(message)
