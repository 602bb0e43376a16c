"""The node watch (node_watcher) through the real kubernetes client, on the in-process double for
what only it produces on demand: injected errors, watches dropped, ended or silenced at a chosen
moment, the history compacted while the watcher is held away. On the real control plane:
tests/cluster/test_cluster_node_watch.py."""

from __future__ import annotations

import socket
import time
from typing import Callable, Iterator

import pytest
from kubernetes.client import CoreV1Api
from urllib3.exceptions import ReadTimeoutError

from image_preflight.kube.watch import _set_read_timeout
from tests.builders.nodes import kube_node, library_images
from tests.fake_apiserver import FakeApiServer
from tests.node_watch_helpers import RecordingSink, Running, Watchers, wait_until

IMAGES = library_images("img0:v1", "img1:v1", "img2:v1")


# --- on the double: injected errors, watches dropped or ended, history compacted ----------------------


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
        fake_apiserver.put_object("nodes", kube_node(name, IMAGES))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    # Keep the watcher away while nodes change, then forget the history it would replay.
    fake_apiserver.fail_next(10**9, status=503)
    fake_apiserver.drop_watches()
    fake_apiserver.delete_object("nodes", "a")
    fake_apiserver.put_object("nodes", kube_node("b", IMAGES, labels={"changed": "yes"}))
    fake_apiserver.put_object("nodes", kube_node("c", IMAGES))
    fake_apiserver.compact()
    fake_apiserver.fail_next(0)

    wait_until(converged(fake_apiserver, run.sink), "the view matches the server after a relist")
    assert "expired" in run.restarts
    assert len(list_calls(fake_apiserver)) == 2
    assert sorted(run.sink.nodes) == ["b", "c"]
    assert run.sink.nodes["b"]["metadata"]["labels"]["changed"] == "yes"


def test_http_410_on_watch_also_relists(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", kube_node("a", IMAGES))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    fake_apiserver.fail_next(1, status=410)
    fake_apiserver.end_watches()
    wait_until(lambda: len(list_calls(fake_apiserver)) == 2, "a 410 answer to the watch triggers a relist")
    assert "expired" in run.restarts
    fake_apiserver.put_object("nodes", kube_node("b", IMAGES))
    wait_until(converged(fake_apiserver, run.sink), "the view keeps following the server")


def test_dropped_connections_reconnect_without_duplicates_or_losses(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", kube_node("n0", IMAGES))
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the first list completes")

    for round_ in range(1, 6):
        fake_apiserver.drop_watches()
        fake_apiserver.put_object("nodes", kube_node(f"n{round_}", IMAGES))
        fake_apiserver.put_object("nodes", kube_node(f"n{round_ - 1}", IMAGES, labels={"round": str(round_)}))
        if round_ % 2 == 0:
            fake_apiserver.delete_object("nodes", f"n{round_ - 2}")
        wait_until(converged(fake_apiserver, run.sink), f"the view converges after drop {round_}")

    assert "error" in run.restarts
    assert len(list_calls(fake_apiserver)) == 1  # resumed every time, never relisted
    upserts = [c for c in run.sink.calls if c[0] == "upsert"]
    assert len(upserts) == len(set(upserts)), "an event was applied twice"


def test_server_errors_back_off_then_recover(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", kube_node("a", IMAGES))
    fake_apiserver.fail_next(2, status=500)
    run = start_watcher()
    wait_until(run.watcher.synced.is_set, "the list succeeds after two failures")
    assert run.restarts[:2] == ["error", "error"]
    assert len(list_calls(fake_apiserver)) == 3

    before = len(fake_apiserver.watch_requests("nodes"))
    fake_apiserver.fail_next(3, status=503)
    fake_apiserver.drop_watches()
    fake_apiserver.put_object("nodes", kube_node("b", IMAGES))
    wait_until(converged(fake_apiserver, run.sink), "the view converges after the errors stop")
    # About one retry per failure, then one watch that stays open: no busy loop. (A bound, not
    # an exact count: the drop and the injected failures race with the watcher's reconnects.)
    assert 4 <= len(fake_apiserver.watch_requests("nodes")) - before <= 8
    assert run.restarts.count("error") >= 2 + 3


# --- on the double: a watch connection that stays open and says nothing ---------------------------------

SILENCE_S = 1.0  # the tests' silence_timeout; the double bookmarks every 0.2 s
MARGIN_S = 1.5  # to reconnect and deliver, on a loaded machine


def test_a_watch_gone_silent_is_restarted_within_its_bound(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", kube_node("a", IMAGES))
    run = start_watcher(silence_timeout=SILENCE_S)
    wait_until(run.watcher.synced.is_set, "the first list completes")
    listed = run.watcher.last_sync
    wait_until(lambda: run.watcher.last_sync > listed, "a bookmark arrives")

    fake_apiserver.silence_watches()
    silenced = time.monotonic()
    fake_apiserver.put_object("nodes", kube_node("b", IMAGES))  # lost in the silent stream
    wait_until(converged(fake_apiserver, run.sink), "the change made during the silence arrives",
               deadline=SILENCE_S + MARGIN_S)
    assert time.monotonic() - silenced > SILENCE_S - 0.5  # the last bookmark came at most 0.2 s before
    assert run.restarts == ["silent"]
    assert len(list_calls(fake_apiserver)) == 1  # resumed from its resourceVersion
    assert len(fake_apiserver.watch_requests("nodes")) == 2


def test_before_its_first_bookmark_a_watch_may_be_silent_until_its_timeout(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", kube_node("a", IMAGES))
    fake_apiserver.silence_next_watches(1)
    run = start_watcher(silence_timeout=SILENCE_S, watch_timeout_seconds=2)
    wait_until(lambda: fake_apiserver.watch_requests("nodes"), "the watch is open")
    opened = time.monotonic()
    fake_apiserver.put_object("nodes", kube_node("b", IMAGES))
    bound = 2 + SILENCE_S  # this double ignores timeoutSeconds, so the client ends the watch
    wait_until(converged(fake_apiserver, run.sink), "the change arrives once the silent watch is dropped",
               deadline=bound + MARGIN_S)
    assert time.monotonic() - opened > bound - 0.3
    assert run.restarts == ["silent"]
    assert len(list_calls(fake_apiserver)) == 1


def test_urllib3_still_lets_a_streaming_watch_change_its_read_timeout(fake_apiserver, fake_api_client):
    """kube/watch.py gives an open watch a read timeout other than its request's, through the socket
    under urllib3's response (response.connection.sock; no public call does it). A urllib3 release
    that moves it fails here, rather than as quiet watches dropped before their first bookmark."""
    since = fake_apiserver.put_object("nodes", kube_node("a", IMAGES))["metadata"]["resourceVersion"]
    fake_apiserver.silence_next_watches(1)  # answered, then says nothing
    response = CoreV1Api(fake_api_client).list_node(watch=True, resource_version=since, _preload_content=False,
                                                    _request_timeout=(5, 0.3))
    try:
        assert isinstance(response.connection.sock, socket.socket)
        _set_read_timeout(response, 1.5)
        started = time.monotonic()
        with pytest.raises(ReadTimeoutError):
            next(response.stream(amt=None))
        assert 1.2 < time.monotonic() - started < 5  # the new bound, not the request's 0.3 s
    finally:
        response.close()
        response.release_conn()


def test_bookmarks_keep_a_quiet_watch_open(fake_apiserver, start_watcher):
    fake_apiserver.put_object("nodes", kube_node("a", IMAGES))
    run = start_watcher(silence_timeout=SILENCE_S)
    wait_until(lambda: fake_apiserver.watch_requests("nodes"), "the watch is open")
    time.sleep(3 * SILENCE_S)  # nothing changes, only bookmarks come
    assert run.restarts == []
    assert time.monotonic() - run.watcher.last_sync < SILENCE_S  # and keep the view proven current
    fake_apiserver.put_object("nodes", kube_node("b", IMAGES))
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
