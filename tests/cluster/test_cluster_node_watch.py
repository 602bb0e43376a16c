"""The node watch (node_watcher) through the real kubernetes client on the real control plane, as the webhook's
ServiceAccount: the first list read in pages and handed over as raw camelCase dicts, then watched
from its resourceVersion; additions, changes and deletions propagated; bookmarks advancing the
resourceVersion, and a quiet watch ended by the apiserver rather than dropped as silent; a failing
sink survived, the label selector passed through, and stop() ending the thread mid-watch."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.controlplane.cluster import Case, ControlPlane, request_query, set_node_images, wait_for
from tests.node_watch_helpers import DEADLINE, RecordingSink, Running, Watchers, wait_until


def images(count: int) -> list[list[str]]:
    return [[f"docker.io/library/img{i}:v1"] for i in range(count)]


@dataclass
class Cluster:
    """Node watchers acting as the webhook's ServiceAccount, each with a fresh token, watching this
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
