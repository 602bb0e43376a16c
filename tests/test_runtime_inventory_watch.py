"""Readers of the agents' NodeImages: the webhook's LiveInventory through the watch, and
`inventory dump` feeding `scan`. Through the real kubernetes client and the in-process apiserver."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.publisher import Publisher
from image_preflight.cli import main
from tests.fake_apiserver import FakeApiServer, write_kubeconfig
from tests.test_webhook_server import start_webhook  # noqa: F401 - fixture
from webhook.admission import API_VERSION, Settings, admit
from webhook.decision import DENY, MISSING, UNKNOWN, decide
from webhook.inventory import image_key
from webhook.live_inventory import LiveInventory
from webhook.node_watch import NodeWatcher, ResourceWatcher
from webhook.runtime_inventory import GROUP, PLURAL, VERSION, format_time
from webhook.runtime_watch import runtime_watcher, start_runtime_watch

CPU, GPU = "cpu-1", "gpu-1"
DEADLINE_S = 10.0
LEASE = 300
BUILT = "docker.io/swebench/sweb.eval.x86_64.repo__built:openai"
NEVER_BUILT = "docker.io/swebench/sweb.eval.x86_64.repo__never-built:openai"
# The kubelet's status shows 50 images (the default nodeStatusMaxImages); the runtime holds 80.
HELD = [f"docker.io/swebench/sweb.eval.x86_64.repo__{n:03d}:openai" for n in range(79)] + [BUILT]


def wait_until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


def register_nodeimages(server: FakeApiServer) -> None:
    server.register(group=GROUP, version=VERSION, resource=PLURAL, kind="NodeImages", namespaced=False)


def kube_node(name: str, pool: str, names: list[str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"pool": pool, "kubernetes.io/hostname": name}},
        "status": {"images": [{"names": [n], "sizeBytes": 10_000_000 - i} for i, n in enumerate(names)]},
    }


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


@pytest.fixture
def cluster(fake_apiserver: FakeApiServer) -> FakeApiServer:
    """cpu-1 at the kubelet's 50-image cap in node status, and a GPU node the Jobs avoid."""
    register_nodeimages(fake_apiserver)
    fake_apiserver.put_object("nodes", kube_node(CPU, "cpu", HELD[:50]))
    fake_apiserver.put_object("nodes", kube_node(GPU, "gpu", [BUILT, NEVER_BUILT]))
    return fake_apiserver


@pytest.fixture
def watched(fake_api_client) -> Iterator[Callable[..., tuple[LiveInventory, ResourceWatcher]]]:
    """A LiveInventory fed by the node watch and the NodeImages watch, as `serve` wires them."""
    stoppers: list[Callable[[], None]] = []

    def start(**runtime_options) -> tuple[LiveInventory, ResourceWatcher]:
        live = LiveInventory()
        nodes = NodeWatcher(fake_api_client, live, backoff_initial=0.01, backoff_max=0.1)
        nodes.start()
        if runtime_options:
            runtime = runtime_watcher(fake_api_client, live, **runtime_options)
            runtime.start()
        else:
            runtime = start_runtime_watch(fake_api_client, live, None)
        stoppers.extend([nodes.stop, runtime.stop])
        wait_until(lambda: live.synced.is_set() and runtime.synced.is_set(), "both watches have listed")
        return live, runtime

    yield start
    for stop in stoppers:
        stop()


def source_of(live: LiveInventory, node: str) -> str | None:
    current = live.current.get(node)
    return current.source if current else None


def test_a_published_complete_list_turns_unknown_into_a_denial(cluster, fake_api_client, watched):
    live, _ = watched()
    now = time.time()
    # Node status alone: cpu-1 is at the cap, so an image absent there proves nothing.
    before = decide(job_spec(NEVER_BUILT), live.current, now=now)
    assert (before.outcome, before.verdicts[0].unknown_on) == (UNKNOWN, (CPU,))
    assert admit(job_review(NEVER_BUILT), live.current, Settings(), now=now).review["response"]["allowed"] is True

    # The agent publishes the runtime's complete list.
    Publisher(fake_api_client, CPU, lease_seconds=LEASE).publish(runtime_images(HELD), now=now)
    wait_until(lambda: source_of(live, CPU) == "cri", "the webhook's inventory takes the published list")

    decision = decide(job_spec(NEVER_BUILT), live.current, now=now)
    assert decision.outcome == DENY
    assert (decision.verdicts[0].status, decision.verdicts[0].missing_on) == (MISSING, (CPU,))
    assert decision.eligible == (CPU,)  # the node's labels still come from node status
    response = admit(job_review(NEVER_BUILT), live.current, Settings(), now=now).review["response"]
    assert (response["allowed"], response["status"]["code"]) == (False, 422)
    assert NEVER_BUILT in response["status"]["message"] and CPU in response["status"]["message"]
    # An image the runtime holds beyond node status' 50 is confirmed.
    assert admit(job_review(BUILT), live.current, Settings(), now=now).review["response"]["allowed"] is True


def test_an_expired_lease_makes_the_list_prove_nothing(cluster, watched):
    live, _ = watched()
    observed = time.time() - 10
    cluster.put_object(PLURAL, node_images(CPU, HELD, observed_at=observed, lease=60), group=GROUP, version=VERSION)
    wait_until(lambda: source_of(live, CPU) == "cri", "the published list is picked up")
    published_at = float(int(observed))  # observedAt keeps whole seconds

    fresh = decide(job_spec(NEVER_BUILT), live.current, now=published_at + 59)
    stale = decide(job_spec(NEVER_BUILT), live.current, now=published_at + 60)
    assert fresh.verdicts[0].status == MISSING
    assert (stale.outcome, stale.verdicts[0].status, stale.verdicts[0].unknown_on) == (UNKNOWN, UNKNOWN, (CPU,))
    assert admit(job_review(NEVER_BUILT), live.current, Settings(), now=published_at + 60).review["response"][
        "allowed"] is True
    # Held images stay confirmed: a stale list still shows what was there.
    assert decide(job_spec(BUILT), live.current, now=published_at + 60).outcome == "allow"


def test_updates_and_deletions_are_followed(cluster, fake_api_client, watched):
    live, _ = watched()
    now = time.time()
    publisher = Publisher(fake_api_client, CPU, lease_seconds=LEASE)
    publisher.publish(runtime_images(HELD), now=now)
    wait_until(lambda: source_of(live, CPU) == "cri", "the published list is picked up")
    assert not live.current.get(CPU).holds(image_key(NEVER_BUILT))

    publisher.publish(runtime_images(HELD + [NEVER_BUILT]), now=now + 1)
    wait_until(lambda: live.current.get(CPU).holds(image_key(NEVER_BUILT)), "the rewritten list is picked up")

    cluster.delete_object(PLURAL, CPU, group=GROUP, version=VERSION)
    wait_until(lambda: source_of(live, CPU) == "node-status", "node status is the source again")
    assert decide(job_spec(NEVER_BUILT), live.current, now=now).outcome == UNKNOWN


def test_an_unreadable_object_is_ignored_and_stops_proving_absences(cluster, watched, caplog):
    live, _ = watched()
    cluster.put_object(PLURAL, node_images(CPU, HELD, observed_at=time.time()), group=GROUP, version=VERSION)
    wait_until(lambda: source_of(live, CPU) == "cri", "the published list is picked up")

    broken = node_images(CPU, HELD, observed_at=time.time())
    del broken["spec"]["leaseDurationSeconds"]
    with caplog.at_level(logging.WARNING, logger="webhook.live_inventory"):
        cluster.put_object(PLURAL, broken, group=GROUP, version=VERSION)
        wait_until(lambda: source_of(live, CPU) == "node-status", "the unreadable list is dropped")
    assert any(f"NodeImages {CPU}: spec.leaseDurationSeconds" in r.getMessage() for r in caplog.records)


def test_without_the_crd_node_status_stays_the_source_until_it_is_installed(fake_apiserver, watched):
    fake_apiserver.put_object("nodes", kube_node(CPU, "cpu", HELD[:50]))
    live, runtime = watched(absent_retry=0.05)
    assert runtime.absent
    assert source_of(live, CPU) == "node-status"
    assert decide(job_spec(NEVER_BUILT), live.current, now=time.time()).outcome == UNKNOWN
    quiet_lists = len([r for r in fake_apiserver.requests if r.path.endswith("/" + PLURAL)])

    register_nodeimages(fake_apiserver)  # the CRD is installed
    fake_apiserver.put_object(PLURAL, node_images(CPU, HELD, observed_at=time.time()), group=GROUP, version=VERSION)
    wait_until(lambda: source_of(live, CPU) == "cri", "the list is picked up once the CRD exists")
    assert not runtime.absent
    assert decide(job_spec(NEVER_BUILT), live.current, now=time.time()).outcome == DENY
    assert quiet_lists >= 1


def test_a_started_watch_stops(cluster, fake_api_client):
    live = LiveInventory()
    watcher = start_runtime_watch(fake_api_client, live, None)
    wait_until(watcher.synced.is_set, "the first list")
    wait_until(lambda: cluster.watch_requests(PLURAL), "the watch is open")
    watcher.stop()
    assert not any(t.name == "nodeimages-watch" and t.is_alive() for t in threading.enumerate())


# -- inventory dump -> scan ---------------------------------------------------------------------


def dump(server: FakeApiServer, tmp_path: Path, capsys) -> tuple[dict, str]:
    kubeconfig = write_kubeconfig(server, tmp_path / "kubeconfig")
    out = tmp_path / "dump.json"
    assert main(["inventory", "dump", "--kubeconfig", str(kubeconfig), "--out", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().err


def scan_report(tmp_path: Path, inventory: Path, images: list[str]) -> dict:
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps({"instance_id": f"i{n}", "image_name": i}) + "\n" for n, i in enumerate(images)))
    template = tmp_path / "job.yaml"
    template.write_text(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {{ job_name }}\nspec:\n  template:\n    spec:\n"
        "      restartPolicy: Never\n      nodeSelector:\n        pool: cpu\n      containers:\n"
        "      - name: rollout\n        image: {{ input.image_name | yaml_escape }}\n"
        "        imagePullPolicy: IfNotPresent\n"
    )
    report = tmp_path / f"report-{inventory.stem}.json"
    main(["scan", str(dataset), "--template", str(template), "--inventory", str(inventory), "--report", str(report)])
    return json.loads(report.read_text())


def test_dump_then_scan_reports_an_absent_image_as_missing(cluster, fake_api_client, tmp_path, capsys):
    Publisher(fake_api_client, CPU, lease_seconds=LEASE).publish(runtime_images(HELD), now=time.time())
    document, _ = dump(cluster, tmp_path, capsys)
    assert document["kind"] == "List"
    assert [(i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in document["items"]] == [
        ("Node", "v1", CPU), ("Node", "v1", GPU), ("NodeImages", f"{GROUP}/{VERSION}", CPU)]

    report = scan_report(tmp_path, tmp_path / "dump.json", [BUILT, NEVER_BUILT, HELD[60]])
    assert [(row["row"], row["reason"], row["images"]) for row in report["dropped"]] == [(1, "missing", [NEVER_BUILT])]

    # The same cluster without the agent's list: node status is capped, so nothing is proven.
    nodes_only = tmp_path / "nodes.json"
    nodes_only.write_text(json.dumps({**document, "items": document["items"][:2]}))
    report = scan_report(tmp_path, nodes_only, [BUILT, NEVER_BUILT, HELD[60]])
    assert sorted((row["row"], row["reason"]) for row in report["dropped"]) == [(0, "unknown"), (1, "unknown"),
                                                                               (2, "unknown")]


def test_dump_leaves_out_lists_that_prove_nothing_or_name_no_node(cluster, tmp_path, capsys):
    cluster.put_object(PLURAL, node_images(CPU, HELD, observed_at=time.time() - 3600), group=GROUP, version=VERSION)
    cluster.put_object(PLURAL, node_images("gone-1", HELD, observed_at=time.time()), group=GROUP, version=VERSION)
    document, err = dump(cluster, tmp_path, capsys)
    assert [i["kind"] for i in document["items"]] == ["Node", "Node"]
    assert f"{PLURAL}/{CPU}: left out: its lease ended" in err
    assert f"{PLURAL}/gone-1: left out: node gone-1 is not in the cluster" in err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_dump_without_the_crd_holds_the_nodes_and_says_so(fake_apiserver, tmp_path, capsys):
    fake_apiserver.put_object("nodes", kube_node(CPU, "cpu", HELD[:3]))
    kubeconfig = write_kubeconfig(fake_apiserver, tmp_path / "kubeconfig")
    assert main(["inventory", "dump", "--kubeconfig", str(kubeconfig)]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert [(i["kind"], i["metadata"]["name"]) for i in document["items"]] == [("Node", CPU)]
    assert f"{PLURAL}.{GROUP} is not served" in captured.err


def test_dump_pages_through_long_lists(cluster, tmp_path, capsys):
    for n in range(250):
        cluster.put_object("nodes", kube_node(f"cpu-{n + 2:03d}", "cpu", HELD[:1]))
    document, _ = dump(cluster, tmp_path, capsys)
    assert len([i for i in document["items"] if i["kind"] == "Node"]) == 252
    pages = [r for r in cluster.requests if r.path == "/api/v1/nodes"]
    assert len(pages) == 3 and all(r.query.get("limit") == "100" for r in pages)


def test_dump_names_an_unreachable_cluster(tmp_path, capsys):
    server = FakeApiServer().start()
    kubeconfig = write_kubeconfig(server, tmp_path / "kubeconfig")
    server.close()
    assert main(["inventory", "dump", "--kubeconfig", str(kubeconfig), "--out", str(tmp_path / "d.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("image-preflight inventory: cannot list nodes: ") and "\n" not in err
    assert not (tmp_path / "d.json").exists()


def test_serve_with_a_kubeconfig_denies_from_a_published_list(fake_apiserver, start_webhook, tmp_path):  # noqa: F811
    # The whole path: `serve` watches Nodes and NodeImages; node status is capped at 50 names,
    # so only the agent's complete list can prove NEVER_BUILT absent.
    register_nodeimages(fake_apiserver)
    fake_apiserver.put_object("nodes", kube_node(CPU, "cpu", HELD[:50]))
    webhook = start_webhook("--kubeconfig", str(write_kubeconfig(fake_apiserver, tmp_path / "kubeconfig")))
    wait_until(lambda: webhook.get("/readyz")[0] == 200, "ready after the first list")

    def response() -> dict:
        return webhook.post(job_review(NEVER_BUILT))[1]["response"]

    assert response()["allowed"] is True  # unknown: allowed with a warning
    fake_apiserver.put_object(PLURAL, node_images(CPU, HELD, observed_at=time.time()), group=GROUP, version=VERSION)
    wait_until(lambda: not response()["allowed"], "denied once the complete list is watched")
    assert response()["status"]["code"] == 422
    assert webhook.post(job_review(HELD[70]))[1]["response"]["allowed"] is True
