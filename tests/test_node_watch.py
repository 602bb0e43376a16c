"""NodeWatcher against the in-process apiserver, through the real kubernetes client."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest

from tests.fake_apiserver import FakeApiServer
from webhook.node_watch import NodeWatcher

DEADLINE = 10.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


def node(name: str, labels: dict[str, str] | None = None, images: int = 3) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {
            "images": [{"names": [f"docker.io/library/img{i}:v1"], "sizeBytes": 1000 + i} for i in range(images)],
            "nodeInfo": {"containerRuntimeVersion": "containerd://1.6.20"},
        },
    }


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
    watcher: NodeWatcher
    sink: RecordingSink
    thread: threading.Thread
    restarts: list[str]


def server_versions(server: FakeApiServer, selected: Callable[[dict], bool] = lambda n: True) -> dict[str, str]:
    return {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in server.list_objects("nodes") if selected(n)}


def converged(server: FakeApiServer, sink: RecordingSink) -> Callable[[], bool]:
    return lambda: sink.versions() == server_versions(server)


def list_calls(server: FakeApiServer) -> list:
    return [r for r in server.requests if r.path == "/api/v1/nodes" and "watch" not in r.query]


@pytest.fixture
def start_watcher(fake_api_client) -> Iterator[Callable[..., Running]]:
    started: list[NodeWatcher] = []

    def start(**options) -> Running:
        restarts: list[str] = []
        sink = RecordingSink()
        options = {"backoff_initial": 0.01, "backoff_max": 0.1, "watch_timeout_seconds": 60, **options}
        watcher = NodeWatcher(fake_api_client, sink, on_restart=restarts.append, **options)
        thread = watcher.start()
        started.append(watcher)
        return Running(watcher, sink, thread, restarts)

    yield start
    for watcher in started:
        watcher.stop()


def test_initial_sync_hands_raw_camel_case_dicts(fake_apiserver, start_watcher):
    for name in ("a", "b", "c"):
        fake_apiserver.put_object("nodes", node(name, images=5))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")
    assert sorted(run.sink.nodes) == ["a", "b", "c"]
    first = run.sink.nodes["a"]
    assert type(first) is dict
    assert first["status"]["nodeInfo"]["containerRuntimeVersion"] == "containerd://1.6.20"
    assert len(first["status"]["images"]) == 5
    assert run.watcher.last_sync is not None
    assert run.sink.calls[0] == ("replace", "a,b,c", None)


def test_added_modified_deleted_propagate(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", node("a"))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    fake_apiserver.put_object("nodes", node("b"))
    wait_until(converged(fake_apiserver, run.sink), "node b is added")

    fake_apiserver.put_object("nodes", node("a", labels={"pool": "gpu"}, images=7))
    wait_until(converged(fake_apiserver, run.sink), "node a is modified")
    assert run.sink.nodes["a"]["metadata"]["labels"] == {"pool": "gpu"}
    assert len(run.sink.nodes["a"]["status"]["images"]) == 7

    fake_apiserver.delete_object("nodes", "b")
    wait_until(converged(fake_apiserver, run.sink), "node b is deleted")
    assert ("delete", "b", None) in run.sink.calls
    assert len(list_calls(fake_apiserver)) == 1


def test_bookmark_advances_resource_version_for_the_next_watch(fake_apiserver, start_watcher):
    fake_apiserver.register(group="", version="v1", resource="configmaps", kind="ConfigMap", namespaced=True)
    fake_apiserver.put_object("nodes", node("a"))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    # Writes elsewhere move the global resourceVersion; only a bookmark can tell the watcher.
    for i in range(3):
        fake_apiserver.put_object("configmaps", {"metadata": {"name": f"cm{i}", "namespace": "default"}})
    target = str(fake_apiserver.resource_version)
    assert target not in server_versions(fake_apiserver).values()
    wait_until(lambda: run.watcher.resource_version == target, "a bookmark carries the newest resourceVersion")

    fake_apiserver.end_watches()
    wait_until(lambda: any(r.query.get("resourceVersion") == target for r in fake_apiserver.watch_requests("nodes")),
               "the watch resumes from the bookmark's resourceVersion")
    assert "closed" in run.restarts
    assert len(list_calls(fake_apiserver)) == 1


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


def test_a_failing_sink_does_not_kill_the_watcher(fake_apiserver, start_watcher):
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")
    run.sink.fail_upserts = 1
    fake_apiserver.put_object("nodes", node("a"))
    wait_until(converged(fake_apiserver, run.sink), "the refused event is delivered again")
    assert run.thread.is_alive()
    assert "error" in run.restarts


def test_label_selector_is_passed_through(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", node("gpu1", labels={"pool": "gpu"}))
    fake_apiserver.put_object("nodes", node("cpu1", labels={"pool": "cpu"}))
    run = start_watcher(label_selector="pool=gpu")
    wait_until(run.watcher.synced.is_set, "the first list completes")
    assert sorted(run.sink.nodes) == ["gpu1"]

    def gpu(n: dict) -> bool:
        return n["metadata"]["labels"].get("pool") == "gpu"

    fake_apiserver.put_object("nodes", node("gpu2", labels={"pool": "gpu"}))
    fake_apiserver.put_object("nodes", node("cpu2", labels={"pool": "cpu"}))
    fake_apiserver.put_object("nodes", node("gpu1", labels={"pool": "cpu"}))  # leaves the selection
    wait_until(lambda: run.sink.versions() == server_versions(fake_apiserver, gpu), "only gpu nodes remain")
    assert sorted(run.sink.nodes) == ["gpu2"]
    calls = [r for r in fake_apiserver.requests if r.path == "/api/v1/nodes"]
    assert calls and all(r.query.get("labelSelector") == "pool=gpu" for r in calls)
    assert any(r.query.get("watch") for r in calls) and any("watch" not in r.query for r in calls)


def test_stop_ends_the_thread_while_a_watch_is_open(fake_apiserver, start_watcher):
    run = start_watcher()
    wait_until(lambda: len(fake_apiserver.watch_requests("nodes")) == 1, "the watch is open")
    run.watcher.stop()
    assert not run.thread.is_alive()


def test_the_list_is_read_in_pages_then_watched_from_its_resource_version(fake_apiserver, start_watcher):
    for n in range(45):
        fake_apiserver.put_object("nodes", node(f"n{n:02d}"))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")
    assert sorted(run.sink.nodes) == [f"n{n:02d}" for n in range(45)]
    pages = list_calls(fake_apiserver)
    assert len(pages) == 9
    assert all(call.query.get("limit") == "5" for call in pages)
    assert "continue" not in pages[0].query and all("continue" in call.query for call in pages[1:])
    fake_apiserver.put_object("nodes", node("n45"))
    wait_until(converged(fake_apiserver, run.sink), "the watch after the paged list delivers a new node")
