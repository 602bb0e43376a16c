"""Readers of the agents' NodeImages: the webhook's LiveInventory through the watch, and
`inventory dump` feeding `scan`. Through the real kubernetes client, on the real control plane;
on the in-process double only for an object the CRD's schema would refuse."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.agent.inventory import CREATE, RENEW
from image_preflight.agent.publisher import Publisher
from image_preflight.cli import main
from image_preflight.core.admission.answers import API_VERSION
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.decision import MISSING, UNKNOWN, Outcome, decide
from image_preflight.core.decide.inventory import image_key
from image_preflight.core.sources.runtime_lists import (
    AGENT_NAMESPACE,
    GROUP,
    PLURAL,
    VERSION,
    format_time,
    image_hashes,
)
from image_preflight.core.sources.snapshots import load_document
from image_preflight.kube.node_images import node_images_watcher, renewal_watcher
from image_preflight.kube.nodes import node_watcher
from image_preflight.kube.watch import ResourceWatcher
from image_preflight.webhook.live_inventory import LiveInventory
from tests.controlplane.cluster import (
    NODEIMAGES_CRD,
    PARKED,
    ControlPlane,
    apply_service_accounts,
    request_query,
    unreachable_kubeconfig,
    wait_for,
)

DEADLINE_S = 10.0
LEASE = 300
BUILT = "docker.io/swebench/sweb.eval.x86_64.repo__built:openai"
NEVER_BUILT = "docker.io/swebench/sweb.eval.x86_64.repo__never-built:openai"
# The kubelet's status shows 50 images (the default nodeStatusMaxImages); the runtime holds 80.
HELD = [f"docker.io/swebench/sweb.eval.x86_64.repo__{n:03d}:openai" for n in range(79)] + [BUILT]
# The Jobs may land on this test's nodes, which carry the PARKED taint.
TOLERATIONS = [{"key": PARKED["key"], "operator": "Exists"}]


def wait_until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


def runtime_images(names: list[str]) -> list[dict]:
    return [{"id": f"sha256:{n:064x}", "repoTags": [name], "repoDigests": [], "size": 1000, "pinned": False}
            for n, name in enumerate(names)]


def node_images(node: str, names: list[str], *, observed_at: float, lease: int = LEASE) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodeImages",
        "metadata": {"name": node},
        "spec": {"nodeName": node, "observedAt": format_time(observed_at), "leaseDurationSeconds": lease,
                 "images": runtime_images(names)},
    }


def job_review(image: str, pool: str = "cpu") -> dict:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rollout-1", "namespace": "default"},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"pool": pool},
            "tolerations": TOLERATIONS,
            "containers": [{"name": "rollout", "image": image, "imagePullPolicy": "IfNotPresent"}],
        }}},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d7a3d6e-0000-4000-8000-000000000001",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "namespace": "default",
            "operation": "CREATE",
            "object": job,
        },
    }


def job_spec(image: str) -> dict:
    return job_review(image)["request"]["object"]["spec"]["template"]["spec"]


def source_of(live: LiveInventory, node: str) -> str | None:
    current = live.current.get(node)
    return current.source if current else None


# --- the cluster ---------------------------------------------------------------------------------


def custom_api(plane: ControlPlane) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(plane.core().api_client)


def create_node_images(plane: ControlPlane, obj: dict) -> dict:
    return custom_api(plane).create_cluster_custom_object(GROUP, VERSION, PLURAL, obj)


def served(plane: ControlPlane) -> bool:
    try:
        custom_api(plane).list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.fixture
def without_the_crd(service_accounts) -> Iterator[Callable[[], None]]:
    """The NodeImages CRD deleted for this test; yields what installs it again, which also happens
    after the test, for the tests after it."""
    service_accounts.kubectl("delete", NODEIMAGES_CRD, "--wait=true")
    wait_for(lambda: not served(service_accounts), "the apiserver no longer serves nodeimages")
    yield lambda: apply_service_accounts(service_accounts)
    apply_service_accounts(service_accounts)


@dataclass
class Nodes:
    cpu: str
    gpu: str


@pytest.fixture
def nodes(service_accounts, case) -> Nodes:
    """cpu-1 at the kubelet's 50-image cap in node status, and a GPU node the Jobs avoid."""
    cpu = case.node("cpu-1", images=[[n] for n in HELD[:50]], labels={"pool": "cpu"}, wait_ready=False)
    gpu = case.node("gpu-1", images=[[BUILT], [NEVER_BUILT]], labels={"pool": "gpu"}, wait_ready=False)
    case.wait_ready()
    return Nodes(cpu["metadata"]["name"], gpu["metadata"]["name"])


@pytest.fixture
def reader(service_accounts, tmp_path) -> Path:
    """A kubeconfig of the webhook's ServiceAccount with a token of this test's own."""
    return service_accounts.service_account_kubeconfig("image-preflight", "image-preflight", tmp_path / "reader.kc")


@pytest.fixture
def publisher_api(service_accounts, tmp_path) -> Iterator[k8s.ApiClient]:
    """A client acting as the node agent's ServiceAccount."""
    kubeconfig = service_accounts.service_account_kubeconfig("image-preflight-agent", "image-preflight-agent",
                                                             tmp_path / "agent.kc")
    api_client = service_accounts.api_client(kubeconfig)
    yield api_client
    api_client.close()


def nodeimages_requests(plane: ControlPlane, kubeconfig: Path, verb: str) -> list[dict]:
    return [r for r in plane.audited_requests(kubeconfig) if r["resource"] == PLURAL and r["verb"] == verb]


@pytest.fixture
def watched(service_accounts, case, reader) -> Iterator[Callable[..., tuple[LiveInventory, ResourceWatcher]]]:
    """A LiveInventory fed by the node watch (this test's nodes) and the NodeImages watch, as `serve`
    wires them, acting as the webhook's ServiceAccount."""
    api_client = service_accounts.api_client(reader)
    stoppers: list[Callable[[], None]] = []

    def start(**runtime_options) -> tuple[LiveInventory, ResourceWatcher]:
        live = LiveInventory()
        nodes = node_watcher(api_client, live, label_selector=case.selector, backoff_initial=0.01, backoff_max=0.1)
        nodes.start()
        runtime = node_images_watcher(api_client, live, **runtime_options)
        runtime.start()
        renewals = renewal_watcher(api_client, live, AGENT_NAMESPACE)
        renewals.start()
        stoppers.extend([nodes.stop, runtime.stop, renewals.stop])
        wait_until(lambda: live.synced.is_set() and runtime.synced.is_set() and renewals.synced.is_set(),
                   "the watches have listed")
        return live, runtime

    yield start
    for stop in stoppers:
        stop()
    api_client.close()


@pytest.mark.parametrize("hashed", [False, True], ids=["images", "hashes"])
def test_a_published_complete_list_turns_unknown_into_a_denial(nodes, publisher_api, watched, hashed):
    live, _ = watched()
    now = time.time()
    # Node status alone: cpu-1 is at the cap, so an image absent there proves nothing.
    before = decide(job_spec(NEVER_BUILT), live.current, now=now)
    assert (before.outcome, before.verdicts[0].unknown_on) == (Outcome.UNKNOWN, (nodes.cpu,))
    assert admit(job_review(NEVER_BUILT), live.current, Settings(), now=now).review["response"]["allowed"] is True

    # The agent publishes the runtime's complete list.
    Publisher(publisher_api, nodes.cpu, lease_seconds=LEASE, hashed=hashed).publish(runtime_images(HELD), now=now)
    wait_until(lambda: source_of(live, nodes.cpu) == "cri", "the webhook's inventory takes the published list")

    decision = decide(job_spec(NEVER_BUILT), live.current, now=now)
    assert decision.outcome == Outcome.DENY
    assert (decision.verdicts[0].status, decision.verdicts[0].missing_on) == (MISSING, (nodes.cpu,))
    assert decision.eligible == (nodes.cpu,)  # the node's labels still come from node status
    response = admit(job_review(NEVER_BUILT), live.current, Settings(), now=now).review["response"]
    assert (response["allowed"], response["status"]["code"]) == (False, 422)
    assert NEVER_BUILT in response["status"]["message"] and nodes.cpu in response["status"]["message"]
    # An image the runtime holds beyond node status' 50 is confirmed.
    assert admit(job_review(BUILT), live.current, Settings(), now=now).review["response"]["allowed"] is True


def test_a_hashed_list_renewed_by_its_lease_proves_absences_past_its_own_lease(control_plane, nodes, publisher_api,
                                                                              watched):
    live, _ = watched()
    now = time.time()
    publisher = Publisher(publisher_api, nodes.cpu, lease_seconds=30, hashed=True)
    assert publisher.publish(runtime_images(HELD), now=now - 25) == CREATE  # current until now + 5 s
    wait_until(lambda: source_of(live, nodes.cpu) == "cri", "the webhook's inventory takes the published list")
    assert decide(job_spec(NEVER_BUILT), live.current, now=now + 20).outcome == Outcome.UNKNOWN  # its lease ran out
    assert publisher.publish(runtime_images(HELD), now=now) == RENEW  # the Lease alone
    wait_until(lambda: decide(job_spec(NEVER_BUILT), live.current, now=now + 20).outcome == Outcome.DENY,
               "the Lease's renewal reaches the webhook's inventory")
    # The renewal's lease runs out too.
    assert decide(job_spec(NEVER_BUILT), live.current, now=now + 31).outcome == Outcome.UNKNOWN
    # The Lease gone, the list counts as written again.
    k8s.CoordinationV1Api(control_plane.core().api_client).delete_namespaced_lease(nodes.cpu, AGENT_NAMESPACE)
    wait_until(lambda: decide(job_spec(NEVER_BUILT), live.current, now=now + 20).outcome == Outcome.UNKNOWN,
               "the deleted Lease renews nothing")


def test_an_expired_lease_makes_the_list_prove_nothing(control_plane, nodes, watched):
    live, _ = watched()
    observed = time.time() - 10
    create_node_images(control_plane, node_images(nodes.cpu, HELD, observed_at=observed, lease=60))
    wait_until(lambda: source_of(live, nodes.cpu) == "cri", "the published list is picked up")
    published_at = float(int(observed))  # observedAt keeps whole seconds

    fresh = decide(job_spec(NEVER_BUILT), live.current, now=published_at + 59)
    stale = decide(job_spec(NEVER_BUILT), live.current, now=published_at + 60)
    assert fresh.verdicts[0].status == MISSING
    assert (stale.outcome, stale.verdicts[0].status, stale.verdicts[0].unknown_on) == (
        Outcome.UNKNOWN, UNKNOWN, (nodes.cpu,))
    assert admit(job_review(NEVER_BUILT), live.current, Settings(), now=published_at + 60).review["response"][
        "allowed"] is True
    # Held images stay confirmed: a stale list still shows what was there.
    assert decide(job_spec(BUILT), live.current, now=published_at + 60).outcome == "allow"


def test_a_runtime_without_its_sandbox_image_denies_every_job_that_may_land_there(control_plane, nodes, watched):
    """spec.sandboxImage as the node agent publishes it, through the CRD's schema (an unknown field
    would be pruned), to the webhook's inventory: even an image the node holds is denied there."""
    live, _ = watched()
    now = time.time()
    obj = node_images(nodes.cpu, HELD, observed_at=now)
    obj["spec"]["sandboxImage"] = {"name": "registry.k8s.io/pause:3.10.1", "present": False}
    stored = create_node_images(control_plane, obj)
    assert stored["spec"].get("sandboxImage") == obj["spec"]["sandboxImage"], "the CRD pruned spec.sandboxImage"
    wait_until(lambda: source_of(live, nodes.cpu) == "cri", "the published list is picked up")

    decision = decide(job_spec(BUILT), live.current, now=now)
    assert (decision.outcome, decision.sandbox_missing) == (
        Outcome.DENY, ((nodes.cpu, "registry.k8s.io/pause:3.10.1"),))
    response = admit(job_review(BUILT), live.current, Settings(), now=now).review["response"]
    assert (response["allowed"], response["status"]["code"]) == (False, 422)
    assert response["status"]["message"].startswith(
        f"invalid: eligible node(s) {nodes.cpu} cannot start any pod: the container runtime lacks its sandbox image "
        "'registry.k8s.io/pause:3.10.1'")


def test_updates_and_deletions_are_followed(control_plane, nodes, publisher_api, watched):
    live, _ = watched()
    now = time.time()
    publisher = Publisher(publisher_api, nodes.cpu, lease_seconds=LEASE)
    publisher.publish(runtime_images(HELD), now=now)
    wait_until(lambda: source_of(live, nodes.cpu) == "cri", "the published list is picked up")
    assert not live.current.get(nodes.cpu).holds(image_key(NEVER_BUILT))

    publisher.publish(runtime_images(HELD + [NEVER_BUILT]), now=now + 1)
    wait_until(lambda: live.current.get(nodes.cpu).holds(image_key(NEVER_BUILT)), "the rewritten list is picked up")

    custom_api(control_plane).delete_cluster_custom_object(GROUP, VERSION, PLURAL, nodes.cpu)
    wait_until(lambda: source_of(live, nodes.cpu) == "node-status", "node status is the source again")
    assert decide(job_spec(NEVER_BUILT), live.current, now=now).outcome == Outcome.UNKNOWN


def test_without_the_crd_node_status_stays_the_source_until_it_is_installed(
        control_plane, without_the_crd, nodes, reader, watched):
    live, runtime = watched(absent_retry=0.05)
    assert runtime.absent
    assert source_of(live, nodes.cpu) == "node-status"
    assert decide(job_spec(NEVER_BUILT), live.current, now=time.time()).outcome == Outcome.UNKNOWN
    wait_for(lambda: len([r for r in nodeimages_requests(control_plane, reader, "list") if r["code"] == 404]) >= 2,
             "the list is tried again while the CRD is missing", timeout_s=DEADLINE_S)

    without_the_crd()  # the CRD is installed
    create_node_images(control_plane, node_images(nodes.cpu, HELD, observed_at=time.time()))
    wait_until(lambda: source_of(live, nodes.cpu) == "cri", "the list is picked up once the CRD exists")
    assert not runtime.absent
    assert decide(job_spec(NEVER_BUILT), live.current, now=time.time()).outcome == Outcome.DENY


def test_a_started_watch_stops(service_accounts, reader):
    live = LiveInventory()
    with service_accounts.api_client(reader) as api_client:
        watcher = node_images_watcher(api_client, live)
        watcher.start()
        wait_until(watcher.synced.is_set, "the first list")
        wait_for(lambda: nodeimages_requests(service_accounts, reader, "watch"), "the watch is open",
                 timeout_s=DEADLINE_S)
        watcher.stop()
    assert not any(t.name == "nodeimages-watch" and t.is_alive() for t in threading.enumerate())


# -- inventory dump -> scan ---------------------------------------------------------------------


def dump(kubeconfig: Path, tmp_path: Path, capsys) -> tuple[dict, str]:
    out = tmp_path / "dump.json"
    assert main(["inventory", "dump", "--kubeconfig", str(kubeconfig), "--out", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().err


def only(document: dict, names: set[str]) -> dict:
    """The dumped List without the objects of other tests sharing the cluster."""
    return {**document, "items": [i for i in document["items"] if i["metadata"]["name"] in names]}


def scan_report(tmp_path: Path, document: dict, images: list[str]) -> dict:
    inventory = tmp_path / f"inventory-{len(list(tmp_path.glob('inventory-*')))}.json"
    inventory.write_text(json.dumps(document))
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"instance_id": f"i{n}", "image_name": i}) + "\n"
                               for n, i in enumerate(images)))
    template = tmp_path / "job.yaml"
    template.write_text(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {{ job_name }}\nspec:\n  template:\n    spec:\n"
        "      restartPolicy: Never\n      nodeSelector:\n        pool: cpu\n"
        f"      tolerations: {json.dumps(TOLERATIONS)}\n      containers:\n"
        "      - name: rollout\n        image: {{ input.image_name | yaml_escape }}\n"
        "        imagePullPolicy: IfNotPresent\n"
    )
    report = tmp_path / f"report-{inventory.stem}.json"
    main(["scan", str(dataset), "--template", str(template), "--inventory", str(inventory), "--report", str(report)])
    return json.loads(report.read_text())


@pytest.mark.parametrize("hashed", [False, True], ids=["images", "hashes"])
def test_dump_then_scan_reports_an_absent_image_as_missing(control_plane, nodes, publisher_api, tmp_path, capsys,
                                                           hashed):
    publisher = Publisher(publisher_api, nodes.cpu, lease_seconds=LEASE, hashed=hashed)
    now = time.time()
    publisher.publish(runtime_images(HELD), now=now - LEASE + 1 if hashed else now)
    # A hashed list is current by its Lease's renewal alone: a second after the dump, it would not be.
    assert publisher.publish(runtime_images(HELD), now=now) == (RENEW if hashed else None)
    document, _ = dump(control_plane.kubeconfig, tmp_path, capsys)
    assert document["kind"] == "List"
    ours = only(document, {nodes.cpu, nodes.gpu})
    assert [(i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in ours["items"]] == [
        ("Node", "v1", nodes.cpu), ("Node", "v1", nodes.gpu), ("NodeImages", f"{GROUP}/{VERSION}", nodes.cpu)] + (
        [("Lease", "coordination.k8s.io/v1", nodes.cpu)] if hashed else [])
    if hashed:  # read with a clock, as serve --inventory reads it
        assert load_document(ours, source="dump", observed_at=now + 5).get(nodes.cpu).conclusive(now + 5)

    report = scan_report(tmp_path, ours, [BUILT, NEVER_BUILT, HELD[60]])
    assert [(row["row"], row["reason"], row["images"]) for row in report["dropped"]] == [(1, "missing", [NEVER_BUILT])]

    # The same cluster without the agent's list: node status is capped, so nothing is proven.
    nodes_only = {**ours, "items": [i for i in ours["items"] if i["kind"] == "Node"]}
    report = scan_report(tmp_path, nodes_only, [BUILT, NEVER_BUILT, HELD[60]])
    assert sorted((row["row"], row["reason"]) for row in report["dropped"]) == [(0, "unknown"), (1, "unknown"),
                                                                               (2, "unknown")]


def test_dump_carries_runtime_classes_that_scan_and_serve_read(control_plane, case, tmp_path, capsys):
    from kubernetes import client as k8s

    from image_preflight.api import load_inventory

    name = case.name("gvisor")
    k8s.NodeV1Api(control_plane.core().api_client).create_runtime_class(
        {"metadata": {"name": name, "labels": case.labels}, "handler": "runsc",
         "scheduling": {"nodeSelector": {"runtime": "gvisor"}}})
    document, err = dump(control_plane.kubeconfig, tmp_path, capsys)
    (item,) = only(document, {name})["items"]
    assert (item["apiVersion"], item["kind"]) == ("node.k8s.io/v1", "RuntimeClass") and "RuntimeClasses" in err
    inventory = load_inventory(tmp_path / "dump.json")
    assert dict(inventory.runtime_classes[name].node_selector) == {"runtime": "gvisor"}


def test_dump_leaves_out_lists_that_prove_nothing_or_name_no_node(control_plane, case, nodes, tmp_path, capsys):
    gone = case.name("gone-1")
    create_node_images(control_plane, node_images(nodes.cpu, HELD, observed_at=time.time() - 3600))
    create_node_images(control_plane, node_images(gone, HELD, observed_at=time.time()))
    document, err = dump(control_plane.kubeconfig, tmp_path, capsys)
    assert [(i["kind"], i["metadata"]["name"]) for i in only(document, {nodes.cpu, nodes.gpu, gone})["items"]] == [
        ("Node", nodes.cpu), ("Node", nodes.gpu)]
    assert f"{PLURAL}/{nodes.cpu}: left out: its lease ended" in err
    assert f"{PLURAL}/{gone}: left out: node {gone} is not in the cluster" in err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_dump_without_the_crd_holds_the_nodes_and_says_so(control_plane, without_the_crd, case, capsys):
    cpu = case.node("cpu-1", images=[[n] for n in HELD[:3]], wait_ready=False)["metadata"]["name"]
    assert main(["inventory", "dump", "--kubeconfig", str(control_plane.kubeconfig)]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert {i["kind"] for i in document["items"]} == {"Node"}
    assert [i["metadata"]["name"] for i in only(document, {cpu})["items"]] == [cpu]
    assert f"{PLURAL}.{GROUP} is not served" in captured.err


def test_dump_pages_through_long_lists(control_plane, case, reader, tmp_path, capsys):
    names = [case.name(f"page-{n:03d}") for n in range(250)]
    for name in names:
        obj = node_images(name, HELD[:1], observed_at=time.time())
        create_node_images(control_plane, {**obj, "metadata": {**obj["metadata"], "labels": case.labels}})
    stored = len(custom_api(control_plane).list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"])
    _, err = dump(reader, tmp_path, capsys)
    assert all(f"{PLURAL}/{name}: left out: node {name} is not in the cluster" in err for name in names)
    pages = [request_query(r) for r in nodeimages_requests(control_plane, reader, "list")]
    assert len(pages) == -(-stored // 100) >= 3
    assert all(page.get("limit") == "100" for page in pages)
    assert "continue" not in pages[0] and all("continue" in page for page in pages[1:])


def test_dump_names_an_unreachable_cluster(tmp_path, capsys):
    kubeconfig = unreachable_kubeconfig(tmp_path / "kubeconfig")
    assert main(["inventory", "dump", "--kubeconfig", str(kubeconfig), "--out", str(tmp_path / "d.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("image-preflight inventory dump: cannot list nodes: ") and "\n" not in err
    assert not (tmp_path / "d.json").exists()


@pytest.mark.parametrize("hashed", [False, True], ids=["images", "hashes"])
def test_serve_with_a_kubeconfig_denies_from_a_published_list(control_plane, case, nodes, reader,
                                                              start_webhook, hashed):
    # The whole path: `serve` watches Nodes and NodeImages; node status is capped at 50 names,
    # so only the agent's complete list can prove NEVER_BUILT absent.
    webhook = start_webhook("--kubeconfig", str(reader), "--node-selector", case.selector)
    wait_until(lambda: webhook.get("/readyz")[0] == 200, "ready after the first list")

    def response() -> dict:
        return webhook.post(job_review(NEVER_BUILT))[1]["response"]

    assert response()["allowed"] is True  # unknown: allowed with a warning
    published = node_images(nodes.cpu, HELD, observed_at=time.time())
    if hashed:
        published["spec"]["imageHashes"] = image_hashes(published["spec"].pop("images"))
    create_node_images(control_plane, published)
    wait_until(lambda: not response()["allowed"], "denied once the complete list is watched")
    assert response()["status"]["code"] == 422
    assert webhook.post(job_review(HELD[70]))[1]["response"]["allowed"] is True


def test_switching_the_published_form_back_and_forth_changes_no_decision(control_plane, case, nodes, reader,
                                                                       publisher_api, start_webhook):
    """The upgrade's second step (docs/agent.md, "The published form"): the agent rewrites its list
    in the other form while reviews stream in; serve decides each the same way throughout."""
    webhook = start_webhook("--kubeconfig", str(reader), "--node-selector", case.selector)
    wait_until(lambda: webhook.get("/readyz")[0] == 200, "ready after the first list")
    images = runtime_images(HELD)
    Publisher(publisher_api, nodes.cpu, lease_seconds=LEASE).publish(images, now=time.time())
    expected = {NEVER_BUILT: False, HELD[70]: True, BUILT: True}  # HELD[70]: beyond node status' 50
    wait_until(lambda: not webhook.post(job_review(NEVER_BUILT))[1]["response"]["allowed"], "the listed form read")
    wrong: list[tuple[str, bool]] = []
    reviews = 0
    stop = threading.Event()

    def stream() -> None:
        nonlocal reviews
        while not stop.is_set():
            for image, allowed in expected.items():
                if webhook.post(job_review(image))[1]["response"]["allowed"] is not allowed:
                    wrong.append((image, not allowed))
                reviews += 1

    streaming = threading.Thread(target=stream, daemon=True)
    streaming.start()
    forms = []
    for switch in range(6):
        Publisher(publisher_api, nodes.cpu, lease_seconds=LEASE, hashed=switch % 2 == 0).publish(images,
                                                                                                  now=time.time())
        stored = k8s.CustomObjectsApi(control_plane.core().api_client).get_cluster_custom_object(
            GROUP, VERSION, PLURAL, nodes.cpu)
        forms.append(sorted({"images", "imageHashes"} & set(stored["spec"])))
        time.sleep(0.3)
    stop.set()
    streaming.join(30)
    assert forms == [["imageHashes"], ["images"]] * 3
    assert wrong == [] and reviews >= 60, (wrong, reviews)


def test_serve_is_ready_only_once_it_holds_the_published_lists(service_accounts, case, nodes, start_webhook,
                                                               tmp_path):
    # A replica answering before the agents' lists are read would let NEVER_BUILT through as
    # unknown (node status stops at 50 names). Here those lists stay unreadable (403) while the
    # Nodes are read, then become readable: the first answer after /readyz 200 already denies.
    plane, account = service_accounts, f"late-reader-{case.id}"
    create_node_images(plane, node_images(nodes.cpu, HELD, observed_at=time.time()))
    rules = {"nodes": "nodes,runtimeclasses.node.k8s.io", "lists": "nodeimages.image-preflight.io"}
    plane.kubectl("create", "serviceaccount", account, "-n", "image-preflight")
    try:
        for part, resources in rules.items():
            plane.kubectl("create", "clusterrole", f"{account}-{part}", "--verb=list,watch", f"--resource={resources}")
        plane.kubectl("create", "clusterrolebinding", f"{account}-nodes", f"--clusterrole={account}-nodes",
                      f"--serviceaccount=image-preflight:{account}")
        kubeconfig = plane.service_account_kubeconfig("image-preflight", account, tmp_path / "late.kc")
        webhook = start_webhook("--kubeconfig", str(kubeconfig), "--node-selector", case.selector)
        wait_until(lambda: 'image_preflight_watch_restarts_total{reason="error"}' in webhook.metrics(),
                   "the forbidden list of nodeimages is counted")
        assert webhook.get("/readyz")[0] == 503

        plane.kubectl("create", "clusterrolebinding", f"{account}-lists", f"--clusterrole={account}-lists",
                      f"--serviceaccount=image-preflight:{account}")
        deadline = time.monotonic() + 30  # the watch's retry backs off up to 5 s; RBAC settles too
        while webhook.get("/readyz")[0] != 200:
            assert time.monotonic() < deadline, "never ready once the lists are readable"
            time.sleep(0.05)
        status, reply = webhook.post(job_review(NEVER_BUILT))
        assert status == 200 and reply["response"]["allowed"] is False
        assert reply["response"]["status"]["code"] == 422
    finally:
        for kind, suffix in (("clusterrolebinding", "nodes"), ("clusterrolebinding", "lists"),
                             ("clusterrole", "nodes"), ("clusterrole", "lists")):
            plane.kubectl("delete", kind, f"{account}-{suffix}", "--ignore-not-found")
        plane.kubectl("delete", "serviceaccount", account, "-n", "image-preflight", "--ignore-not-found")


# --- on the double: an object the CRD's schema would refuse -----------------------------------------


CPU = "cpu-1"


def kube_node(name: str, pool: str, names: list[str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"pool": pool, "kubernetes.io/hostname": name}},
        "status": {"images": [{"names": [n], "sizeBytes": 10_000_000 - i} for i, n in enumerate(names)]},
    }


@pytest.fixture
def watched_double(fake_apiserver, fake_api_client) -> Iterator[LiveInventory]:
    fake_apiserver.register(group=GROUP, version=VERSION, resource=PLURAL, kind="NodeImages")
    fake_apiserver.put_object("nodes", kube_node(CPU, "cpu", HELD[:50]))
    live = LiveInventory()
    nodes = node_watcher(fake_api_client, live, backoff_initial=0.01, backoff_max=0.1)
    nodes.start()
    runtime = node_images_watcher(fake_api_client, live)
    runtime.start()
    wait_until(lambda: live.synced.is_set() and runtime.synced.is_set(), "both watches have listed")
    yield live
    nodes.stop()
    runtime.stop()


def test_an_unreadable_object_is_ignored_and_stops_proving_absences(fake_apiserver, watched_double, caplog):
    live = watched_double
    fake_apiserver.put_object(PLURAL, node_images(CPU, HELD, observed_at=time.time()), group=GROUP, version=VERSION)
    wait_until(lambda: source_of(live, CPU) == "cri", "the published list is picked up")

    broken = node_images(CPU, HELD, observed_at=time.time())
    del broken["spec"]["leaseDurationSeconds"]  # required by the CRD: the real apiserver refuses it
    with caplog.at_level(logging.WARNING, logger="image_preflight.webhook.live_inventory"):
        fake_apiserver.put_object(PLURAL, broken, group=GROUP, version=VERSION)
        wait_until(lambda: source_of(live, CPU) == "node-status", "the unreadable list is dropped")
    assert any(f"NodeImages {CPU}: spec.leaseDurationSeconds" in r.getMessage() for r in caplog.records)
