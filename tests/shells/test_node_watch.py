"""NodeWatcher through the real kubernetes client: on the real control plane, and on the in-process
double for what only it produces on demand (injected errors, watches dropped, ended or silenced at a
chosen moment, the history compacted while the watcher is held away)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import Case, ControlPlane, request_query, set_node_images, wait_for
from tests.fake_apiserver import FakeApiServer
from image_preflight.kube.nodes import NodeWatcher
from image_preflight.kube.watch import ResourceWatcher

DEADLINE = 10.0


def wait_until(condition: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


class RecordingSink:
    """A dict view of the nodes plus a log of every call, for duplicate checks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.nodes: dict[str, dict] = {}
        self.calls: list[tuple[str, str, str | None]] = []  # (call, name, resourceVersion)
        self.fail_upserts = 0

    def replace_nodes(self, nodes: list[dict]) -> None:
        with self._lock:
            self.nodes = {n["metadata"]["name"]: n for n in nodes}
            self.calls.append(("replace", ",".join(sorted(self.nodes)), None))

    def upsert_node(self, node: dict) -> None:
        with self._lock:
            if self.fail_upserts:
                self.fail_upserts -= 1
                raise RuntimeError("sink refused the node")
            self.nodes[node["metadata"]["name"]] = node
            self.calls.append(("upsert", node["metadata"]["name"], node["metadata"]["resourceVersion"]))

    def delete_node(self, name: str) -> None:
        with self._lock:
            self.nodes.pop(name, None)
            self.calls.append(("delete", name, None))

    def versions(self) -> dict[str, str]:
        with self._lock:
            return {name: n["metadata"]["resourceVersion"] for name, n in self.nodes.items()}


@dataclass
class Running:
    watcher: ResourceWatcher
    sink: RecordingSink
    thread: threading.Thread
    restarts: list[str]


def node_watcher(api_client: k8s.ApiClient, sink: RecordingSink, **options) -> ResourceWatcher:
    """A NodeWatcher; with `silence_timeout`, which NodeWatcher does not pass on, the same
    ResourceWatcher over list_node."""
    if "silence_timeout" not in options:
        return NodeWatcher(api_client, sink, **options)
    return ResourceWatcher(k8s.CoreV1Api(api_client).list_node, replace=sink.replace_nodes, upsert=sink.upsert_node,
                           delete=lambda node: sink.delete_node(node["metadata"]["name"]), what="node", **options)


class Watchers:
    def __init__(self) -> None:
        self.started: list[ResourceWatcher] = []

    def start(self, api_client: k8s.ApiClient, **options) -> Running:
        restarts: list[str] = []
        sink = RecordingSink()
        options = {"backoff_initial": 0.01, "backoff_max": 0.1, "watch_timeout_seconds": 60, **options}
        watcher = node_watcher(api_client, sink, on_restart=restarts.append, **options)
        thread = watcher.start()
        self.started.append(watcher)
        return Running(watcher, sink, thread, restarts)

    def stop(self) -> None:
        for watcher in self.started:
            watcher.stop()


def images(count: int) -> list[list[str]]:
    return [[f"docker.io/library/img{i}:v1"] for i in range(count)]


# --- on the real control plane -------------------------------------------------------------------


@dataclass
class Cluster:
    """NodeWatchers acting as the webhook's ServiceAccount, each with a fresh token, watching this
    test's nodes only; the audit log holds their requests."""

    plane: ControlPlane
    case: Case
    kubeconfig: Path
    start: Callable[..., Running]

    def versions(self, selector: str | None = None) -> dict[str, str]:
        listed = self.plane.core().list_node(label_selector=selector or self.case.selector).items
        return {n.metadata.name: n.metadata.resource_version for n in listed}

    def converged(self, sink: RecordingSink) -> Callable[[], bool]:
        return lambda: sink.versions() == self.versions()

    def requests(self, verb: str | None = None) -> list[dict]:
        """The watchers' requests on nodes: each list once it completed, each watch as it opened."""
        stage = {"list": "ResponseComplete", "watch": "ResponseStarted"}
        return [r for r in self.plane.audited_requests(self.kubeconfig)
                if r["resource"] == "nodes" and r["stage"] == stage.get(r["verb"])
                and (verb is None or r["verb"] == verb)]


@pytest.fixture
def cluster(service_accounts, case, tmp_path) -> Iterator[Cluster]:
    kubeconfig = service_accounts.service_account_kubeconfig("image-preflight", "image-preflight",
                                                             tmp_path / "watcher.kubeconfig")
    api_client = service_accounts.api_client(kubeconfig)
    watchers = Watchers()
    yield Cluster(service_accounts, case, kubeconfig,
                  lambda **options: watchers.start(api_client, **{"label_selector": case.selector, **options}))
    watchers.stop()
    api_client.close()


def test_initial_sync_hands_raw_camel_case_dicts(cluster):
    names = [cluster.case.node(base, images=images(5), wait_ready=False)["metadata"]["name"] for base in "abc"]
    cluster.plane.core().patch_node_status(names[0], {"status": {"nodeInfo": {
        "containerRuntimeVersion": "containerd://1.6.20"}}})
    run = cluster.start()
    wait_until(run.watcher.synced.is_set, "the first list completes")
    assert sorted(run.sink.nodes) == names
    first = run.sink.nodes[names[0]]
    assert type(first) is dict
    assert first["status"]["nodeInfo"]["containerRuntimeVersion"] == "containerd://1.6.20"
    assert len(first["status"]["images"]) == 5 and first["status"]["images"][0]["sizeBytes"] > 0
    assert run.watcher.last_sync is not None
    assert run.sink.calls[0] == ("replace", ",".join(names), None)


def test_added_modified_deleted_propagate(cluster):
    core = cluster.plane.core()
    a = cluster.case.node("a", images=images(3), wait_ready=False)["metadata"]["name"]
    run = cluster.start()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    b = cluster.case.node("b", images=images(3), wait_ready=False)["metadata"]["name"]
    wait_until(cluster.converged(run.sink), "node b is added")

    core.patch_node(a, {"metadata": {"labels": {"pool": "gpu"}}})
    set_node_images(cluster.plane, a, images(7))
    wait_until(cluster.converged(run.sink), "node a is modified")
    assert run.sink.nodes[a]["metadata"]["labels"]["pool"] == "gpu"
    assert len(run.sink.nodes[a]["status"]["images"]) == 7

    core.delete_node(b)
    wait_until(cluster.converged(run.sink), "node b is deleted")
    assert ("delete", b, None) in run.sink.calls
    assert len(cluster.requests("list")) == 1


def test_bookmark_advances_resource_version_for_the_next_watch(cluster):
    watched = {"image-preflight.test/watched": "yes"}
    cluster.case.node("a", labels=watched)  # ready: nothing writes it from here on
    # The apiserver bookmarks 2 s before a watch's timeout, then ends the watch.
    run = cluster.start(label_selector=f"{cluster.case.selector},image-preflight.test/watched=yes",
                        watch_timeout_seconds=3)
    wait_until(run.watcher.synced.is_set, "the first list completes")

    # A node outside the selection moves the nodes' resourceVersion; only a bookmark can tell the watcher.
    outside = cluster.case.node("outside", wait_ready=False)
    target = int(outside["metadata"]["resource_version"])
    wait_until(lambda: int(run.watcher.resource_version) >= target, "a bookmark carries a newer resourceVersion",
               deadline=30)
    wait_for(lambda: any(int(request_query(r)["resourceVersion"]) >= target for r in cluster.requests("watch")),
             "the watch resumes from the bookmark's resourceVersion", timeout_s=30)
    assert all(int(rv) < target for name, rv in cluster.versions().items() if name != outside["metadata"]["name"])
    assert "closed" in run.restarts
    assert len(cluster.requests("list")) == 1


def test_a_quiet_watch_is_ended_by_the_apiserver_not_dropped_as_silent(cluster):
    watched = {"image-preflight.test/watched": "yes"}
    cluster.case.node("a", labels=watched)  # ready: nothing writes it from here on
    # Until a stream's first bookmark its bound is timeoutSeconds + silence_timeout: the apiserver
    # bookmarks only once the nodes' resourceVersion moves, and otherwise ends the watch in silence.
    run = cluster.start(label_selector=f"{cluster.case.selector},image-preflight.test/watched=yes",
                        watch_timeout_seconds=6, silence_timeout=4)
    wait_until(run.watcher.synced.is_set, "the first list completes")
    listed = time.monotonic()
    wait_until(lambda: run.restarts, "the apiserver ends the watch", deadline=20)
    assert run.restarts[0] == "closed"
    assert time.monotonic() - listed > 5  # longer than silence_timeout, and not called silent
    assert len(cluster.requests("list")) == 1


def test_a_failing_sink_does_not_kill_the_watcher(cluster):
    run = cluster.start()
    wait_until(run.watcher.synced.is_set, "the first list completes")
    run.sink.fail_upserts = 1
    cluster.case.node("a", wait_ready=False)
    wait_until(cluster.converged(run.sink), "the refused event is delivered again")
    assert run.thread.is_alive()
    assert "error" in run.restarts


def test_label_selector_is_passed_through(cluster):
    core = cluster.plane.core()
    gpu1 = cluster.case.node("gpu1", labels={"pool": "gpu"}, wait_ready=False)["metadata"]["name"]
    cluster.case.node("cpu1", labels={"pool": "cpu"}, wait_ready=False)
    selector = f"{cluster.case.selector},pool=gpu"
    run = cluster.start(label_selector=selector)
    wait_until(run.watcher.synced.is_set, "the first list completes")
    assert sorted(run.sink.nodes) == [gpu1]

    gpu2 = cluster.case.node("gpu2", labels={"pool": "gpu"}, wait_ready=False)["metadata"]["name"]
    cluster.case.node("cpu2", labels={"pool": "cpu"}, wait_ready=False)
    core.patch_node(gpu1, {"metadata": {"labels": {"pool": "cpu"}}})  # leaves the selection
    wait_until(lambda: run.sink.versions() == cluster.versions(selector), "only gpu nodes remain")
    assert sorted(run.sink.nodes) == [gpu2]
    calls = cluster.requests()
    assert calls and all(request_query(r).get("labelSelector") == selector for r in calls)
    assert {r["verb"] for r in calls} == {"list", "watch"}


def test_stop_ends_the_thread_while_a_watch_is_open(cluster):
    run = cluster.start()
    wait_for(lambda: cluster.requests("watch"), "the watch is open", timeout_s=DEADLINE)
    run.watcher.stop()
    assert not run.thread.is_alive()


def test_the_list_is_read_in_pages_then_watched_from_its_resource_version(cluster):
    names = [cluster.case.node(f"n{n:02d}", wait_ready=False)["metadata"]["name"] for n in range(12)]
    cluster.case.wait_ready()  # nothing writes them while they are listed
    run = cluster.start()
    wait_until(run.watcher.synced.is_set, "the first list completes")
    listed_at = run.watcher.listed_resource_version  # resource_version moves on with any event
    assert listed_at and sorted(run.sink.nodes) == names
    pages = [request_query(r) for r in cluster.requests("list")]
    assert len(pages) == 3
    assert all(page.get("limit") == "5" for page in pages)
    assert "continue" not in pages[0] and all("continue" in page for page in pages[1:])
    first_watch = wait_for(lambda: cluster.requests("watch"), "the watch is open", timeout_s=DEADLINE)[0]
    assert request_query(first_watch)["resourceVersion"] == listed_at
    cluster.case.node("n12", wait_ready=False)
    wait_until(cluster.converged(run.sink), "the watch after the paged list delivers a new node")


# --- on the double: injected errors, watches dropped or ended, history compacted ----------------------


def node(name: str, labels: dict[str, str] | None = None, images: int = 3) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"images": [{"names": [f"docker.io/library/img{i}:v1"], "sizeBytes": 1000 + i} for i in range(images)]},
    }


def fake_versions(server: FakeApiServer) -> dict[str, str]:
    return {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in server.list_objects("nodes")}


def converged(server: FakeApiServer, sink: RecordingSink) -> Callable[[], bool]:
    return lambda: sink.versions() == fake_versions(server)


def list_calls(server: FakeApiServer) -> list:
    return [r for r in server.requests if r.path == "/api/v1/nodes" and "watch" not in r.query]


@pytest.fixture
def start_watcher(fake_api_client) -> Iterator[Callable[..., Running]]:
    watchers = Watchers()
    yield lambda **options: watchers.start(fake_api_client, **options)
    watchers.stop()


def test_compaction_gives_410_and_a_relist_converges(fake_apiserver, start_watcher):
    for name in ("a", "b"):
        fake_apiserver.put_object("nodes", node(name))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    # Keep the watcher away while nodes change, then forget the history it would replay.
    fake_apiserver.fail_next(10**9, status=503)
    fake_apiserver.drop_watches()
    fake_apiserver.delete_object("nodes", "a")
    fake_apiserver.put_object("nodes", node("b", labels={"changed": "yes"}))
    fake_apiserver.put_object("nodes", node("c"))
    fake_apiserver.compact()
    fake_apiserver.fail_next(0)

    wait_until(converged(fake_apiserver, run.sink), "the view matches the server after a relist")
    assert "expired" in run.restarts
    assert len(list_calls(fake_apiserver)) == 2
    assert sorted(run.sink.nodes) == ["b", "c"]
    assert run.sink.nodes["b"]["metadata"]["labels"] == {"changed": "yes"}


def test_http_410_on_watch_also_relists(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", node("a"))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    fake_apiserver.fail_next(1, status=410)
    fake_apiserver.end_watches()
    wait_until(lambda: len(list_calls(fake_apiserver)) == 2, "a 410 answer to the watch triggers a relist")
    assert "expired" in run.restarts
    fake_apiserver.put_object("nodes", node("b"))
    wait_until(converged(fake_apiserver, run.sink), "the view keeps following the server")


def test_dropped_connections_reconnect_without_duplicates_or_losses(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", node("n0"))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    for round_ in range(1, 6):
        fake_apiserver.drop_watches()
        fake_apiserver.put_object("nodes", node(f"n{round_}"))
        fake_apiserver.put_object("nodes", node(f"n{round_ - 1}", labels={"round": str(round_)}))
        if round_ % 2 == 0:
            fake_apiserver.delete_object("nodes", f"n{round_ - 2}")
        wait_until(converged(fake_apiserver, run.sink), f"the view converges after drop {round_}")

    assert "error" in run.restarts
    assert len(list_calls(fake_apiserver)) == 1  # resumed every time, never relisted
    upserts = [c for c in run.sink.calls if c[0] == "upsert"]
    assert len(upserts) == len(set(upserts)), "an event was applied twice"


def test_server_errors_back_off_then_recover(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", node("a"))
    fake_apiserver.fail_next(2, status=500)
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the list succeeds after two failures")
    assert run.restarts[:2] == ["error", "error"]
    assert len(list_calls(fake_apiserver)) == 3

    before = len(fake_apiserver.watch_requests("nodes"))
    fake_apiserver.fail_next(3, status=503)
    fake_apiserver.drop_watches()
    fake_apiserver.put_object("nodes", node("b"))
    wait_until(converged(fake_apiserver, run.sink), "the view converges after the errors stop")
    # About one retry per failure, then one watch that stays open: no busy loop. (A bound, not
    # an exact count: the drop and the injected failures race with the watcher's reconnects.)
    assert 4 <= len(fake_apiserver.watch_requests("nodes")) - before <= 8
    assert run.restarts.count("error") >= 2 + 3


# --- on the double: a watch connection that stays open and says nothing ---------------------------------

SILENCE_S = 1.0  # the tests' silence_timeout; the double bookmarks every 0.2 s
MARGIN_S = 1.5  # to reconnect and deliver, on a loaded machine


def test_a_watch_gone_silent_is_restarted_within_its_bound(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", node("a"))
    run = start_watcher(silence_timeout=SILENCE_S)
    wait_until(run.watcher.synced.is_set, "the first list completes")
    listed = run.watcher.last_sync
    wait_until(lambda: run.watcher.last_sync > listed, "a bookmark arrives")

    fake_apiserver.silence_watches()
    silenced = time.monotonic()
    fake_apiserver.put_object("nodes", node("b"))  # lost in the silent stream
    wait_until(converged(fake_apiserver, run.sink), "the change made during the silence arrives",
               deadline=SILENCE_S + MARGIN_S)
    assert time.monotonic() - silenced > SILENCE_S - 0.5  # the last bookmark came at most 0.2 s before
    assert run.restarts == ["silent"]
    assert len(list_calls(fake_apiserver)) == 1  # resumed from its resourceVersion
    assert len(fake_apiserver.watch_requests("nodes")) == 2


def test_before_its_first_bookmark_a_watch_may_be_silent_until_its_timeout(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", node("a"))
    fake_apiserver.silence_next_watches(1)
    run = start_watcher(silence_timeout=SILENCE_S, watch_timeout_seconds=2)
    wait_until(lambda: fake_apiserver.watch_requests("nodes"), "the watch is open")
    opened = time.monotonic()
    fake_apiserver.put_object("nodes", node("b"))
    bound = 2 + SILENCE_S  # this double ignores timeoutSeconds, so the client ends the watch
    wait_until(converged(fake_apiserver, run.sink), "the change arrives once the silent watch is dropped",
               deadline=bound + MARGIN_S)
    assert time.monotonic() - opened > bound - 0.3
    assert run.restarts == ["silent"]
    assert len(list_calls(fake_apiserver)) == 1


def test_bookmarks_keep_a_quiet_watch_open(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", node("a"))
    run = start_watcher(silence_timeout=SILENCE_S)
    wait_until(lambda: fake_apiserver.watch_requests("nodes"), "the watch is open")
    time.sleep(3 * SILENCE_S)  # nothing changes, only bookmarks come
    assert run.restarts == []
    assert time.monotonic() - run.watcher.last_sync < SILENCE_S  # and keep the view proven current
    fake_apiserver.put_object("nodes", node("b"))
    wait_until(converged(fake_apiserver, run.sink), "the same watch delivers a change", deadline=SILENCE_S)
    assert len(fake_apiserver.watch_requests("nodes")) == 1


def test_restarts_of_a_watch_that_stays_silent_do_not_prove_the_view_current(fake_apiserver, start_watcher):
    # serve's /readyz fails once last_sync is older than --max-inventory-age.
    run = start_watcher(silence_timeout=SILENCE_S, watch_timeout_seconds=1)
    wait_until(run.watcher.synced.is_set, "the first list completes")
    listed = run.watcher.last_sync
    wait_until(lambda: run.watcher.last_sync > listed, "a bookmark arrives")
    fake_apiserver.silence_next_watches(10**9)  # a stuck apiserver: every watch stays silent
    fake_apiserver.silence_watches()
    time.sleep(0.3)  # a bookmark on its way lands
    proven = run.watcher.last_sync
    wait_until(lambda: run.restarts.count("silent") >= 2, "the silent watches are dropped",
               deadline=SILENCE_S + (1 + SILENCE_S) + 2 * MARGIN_S)
    assert run.watcher.last_sync == proven
    assert len(list_calls(fake_apiserver)) == 1
