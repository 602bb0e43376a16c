"""The in-process apiserver double, exercised through the official kubernetes client: what it serves,
and the conditions it is kept to produce (see its module docstring)."""

from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes import client, config, watch

from tests.fake_apiserver import RecordedRequest, write_kubeconfig

GROUP, VERSION, PLURAL = "preflight.example.com", "v1alpha1", "nodeimages"


def status_body(exc: client.ApiException) -> dict:
    return json.loads(exc.body)


def raw_events(api: client.CoreV1Api, **query) -> list[dict]:
    """Read a watch response to its end without any client-side retry."""
    response = api.list_node(watch=True, _preload_content=False, **query)
    try:
        return [json.loads(line) for line in response.read().decode().splitlines() if line]
    finally:
        response.release_conn()


def open_watch(api: client.CoreV1Api, **query):
    """A watch response and an iterator over its chunks, as they arrive."""
    response = api.list_node(watch=True, _preload_content=False, **query)
    return response, response.stream(amt=None)


@pytest.fixture
def core(fake_api_client) -> client.CoreV1Api:
    return client.CoreV1Api(fake_api_client)


@pytest.fixture
def custom(fake_apiserver, fake_api_client) -> client.CustomObjectsApi:
    fake_apiserver.register(group=GROUP, version=VERSION, resource=PLURAL, kind="NodeImages")
    return client.CustomObjectsApi(fake_api_client)


def test_create_stamps_metadata_and_get_returns_it(core):
    created = core.create_node({"metadata": {"name": "a"}})
    fetched = core.read_node("a")
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert fetched.metadata.uid == created.metadata.uid
    assert fetched.metadata.resource_version == created.metadata.resource_version
    second = core.create_node({"metadata": {"name": "b"}})
    assert int(second.metadata.resource_version) > int(created.metadata.resource_version)
    assert [n.metadata.name for n in core.list_node().items] == ["a", "b"]


def test_lists_are_read_in_pages(fake_apiserver, core):
    for name in ("c", "a", "e", "b", "d"):
        fake_apiserver.put_object("nodes", {"metadata": {"name": name}})
    pages, token = [], None
    while True:
        page = core.list_node(limit=2, **({"_continue": token} if token else {}))
        pages.append([n.metadata.name for n in page.items])
        token = page.metadata._continue
        if not token:
            break
    assert pages == [["a", "b"], ["c", "d"], ["e"]]


def test_custom_objects_are_created_replaced_and_listed(fake_apiserver, custom):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeImages", "metadata": {"name": "n1"}, "spec": {"a": 1}}
    created = custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    replaced = custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n1", {**created, "spec": {"a": 2}})
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    assert int(replaced["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n1")["spec"] == {"a": 2}
    listing = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert listing["kind"] == "NodeImagesList" and [o["spec"] for o in listing["items"]] == [{"a": 2}]
    assert fake_apiserver.get_object(PLURAL, "n1", group=GROUP, version=VERSION)["spec"] == {"a": 2}


def test_put_object_stores_what_a_schema_would_refuse(fake_apiserver, custom):
    fake_apiserver.put_object(PLURAL, {"metadata": {"name": "n1"}, "spec": {"leaseDurationSeconds": "soon"}},
                              group=GROUP, version=VERSION)
    assert custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n1")["spec"] == {"leaseDurationSeconds": "soon"}


def test_errors_are_status_objects_with_the_right_code(core, fake_api_client):
    with pytest.raises(client.ApiException) as missing:
        core.read_node("nope")
    body = status_body(missing.value)
    assert missing.value.status == 404
    assert (body["kind"], body["status"], body["reason"], body["code"]) == ("Status", "Failure", "NotFound", 404)

    with pytest.raises(client.ApiException) as unserved:
        client.CustomObjectsApi(fake_api_client).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert unserved.value.status == 404  # a resource that is not registered, as a CRD not installed


@pytest.mark.parametrize("request_", [
    lambda core: core.list_node(label_selector="pool=gpu"),
    lambda core: core.list_node(field_selector="metadata.name=a"),
    lambda core: core.patch_node("a", {"metadata": {"labels": {"x": "1"}}}),
    lambda core: core.delete_node("a"),
    lambda core: core.list_node(watch=True, _preload_content=False),  # no resourceVersion
], ids=["label selector", "field selector", "patch", "delete", "watch from now"])
def test_what_it_does_not_serve_is_refused_not_approximated(fake_apiserver, core, request_):
    for name in ("a", "b"):
        fake_apiserver.put_object("nodes", {"metadata": {"name": name}})
    stored = fake_apiserver.list_objects("nodes")
    with pytest.raises(client.ApiException) as refused:
        request_(core)
    assert refused.value.status in (400, 405)
    assert fake_apiserver.list_objects("nodes") == stored


def test_watch_replays_events_after_the_given_resource_version(fake_apiserver, core):
    core.create_node({"metadata": {"name": "a"}})
    since = core.create_node({"metadata": {"name": "b"}}).metadata.resource_version
    fake_apiserver.put_object("nodes", {"metadata": {"name": "a", "labels": {"x": "1"}}})
    fake_apiserver.delete_object("nodes", "b")
    response, chunks = open_watch(core, resource_version=since)
    try:
        events = [json.loads(next(chunks)) for _ in range(2)]
    finally:
        response.close()
        response.release_conn()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("MODIFIED", "a"), ("DELETED", "b")]
    assert events[0]["object"]["metadata"]["labels"] == {"x": "1"}


def test_watch_from_before_compaction_gets_an_in_band_410(fake_apiserver, core):
    since = core.create_node({"metadata": {"name": "a"}}).metadata.resource_version
    core.create_node({"metadata": {"name": "b"}})
    fake_apiserver.compact()
    events = raw_events(core, resource_version=since)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    with pytest.raises(client.ApiException) as gone:
        list(watch.Watch().stream(core.list_node, resource_version=since))
    assert gone.value.status == 410


def test_bookmarks_carry_the_current_resource_version(fake_apiserver, core, custom):
    since = core.create_node({"metadata": {"name": "a"}}).metadata.resource_version
    fake_apiserver.put_object(PLURAL, {"metadata": {"name": "n1"}}, group=GROUP, version=VERSION)
    response, chunks = open_watch(core, resource_version=since, allow_watch_bookmarks=True)
    try:
        event = json.loads(next(chunks))
    finally:
        response.close()
        response.release_conn()
    assert event == {"type": "BOOKMARK", "object": {"kind": "Node", "apiVersion": "v1",
                                                    "metadata": {"resourceVersion": str(int(since) + 1)}}}


def test_dropped_watch_breaks_the_clients_stream(fake_apiserver, core):
    since = core.create_node({"metadata": {"name": "a"}}).metadata.resource_version
    response, chunks = open_watch(core, resource_version=since)
    fake_apiserver.put_object("nodes", {"metadata": {"name": "b"}})
    assert json.loads(next(chunks))["type"] == "ADDED"
    fake_apiserver.drop_watches()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        next(chunks)
    response.release_conn()


def test_ended_watch_finishes_the_stream_cleanly(fake_apiserver, core):
    since = core.create_node({"metadata": {"name": "a"}}).metadata.resource_version
    response, chunks = open_watch(core, resource_version=since)
    fake_apiserver.put_object("nodes", {"metadata": {"name": "b"}})
    assert json.loads(next(chunks))["type"] == "ADDED"
    fake_apiserver.end_watches()
    assert list(chunks) == []
    response.release_conn()


def test_silenced_watch_stays_open_and_sends_nothing_more(fake_apiserver, core):
    since = core.create_node({"metadata": {"name": "a"}}).metadata.resource_version
    response, chunks = open_watch(core, resource_version=since, allow_watch_bookmarks=True,
                                  _request_timeout=(5, 1.0))
    assert json.loads(next(chunks))["type"] == "BOOKMARK"
    fake_apiserver.silence_watches()
    fake_apiserver.put_object("nodes", {"metadata": {"name": "b"}})
    received = []
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):  # not the end of the stream, nor a reset
        for chunk in chunks:
            received.append(json.loads(chunk))
    response.release_conn()
    assert [e["type"] for e in received] in ([], ["BOOKMARK"])  # one may have been on its way


def test_silenced_next_watch_is_answered_then_says_nothing(fake_apiserver, core):
    since = core.create_node({"metadata": {"name": "a"}}).metadata.resource_version
    core.create_node({"metadata": {"name": "b"}})
    fake_apiserver.silence_next_watches(1)
    response, chunks = open_watch(core, resource_version=since, allow_watch_bookmarks=True,
                                  _request_timeout=(5, 1.0))
    assert response.status == 200
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        next(chunks)
    response.release_conn()
    response, chunks = open_watch(core, resource_version=since)  # the next one replays as usual
    try:
        assert json.loads(next(chunks))["object"]["metadata"]["name"] == "b"
    finally:
        response.close()
        response.release_conn()


def test_fail_next_answers_errors_then_heals(fake_apiserver, core):
    fake_apiserver.fail_next(2, status=503, message="etcd is having a bad day")
    for _ in range(2):
        with pytest.raises(client.ApiException) as failed:
            core.list_node()
        assert failed.value.status == 503
        assert status_body(failed.value)["reason"] == "ServiceUnavailable"
        assert status_body(failed.value)["message"] == "etcd is having a bad day"
    assert core.list_node().items == []
    assert [(r.method, r.path) for r in fake_apiserver.requests] == [("GET", "/api/v1/nodes")] * 3


def test_fail_next_0_heals_failures_still_pending(fake_apiserver, core):
    fake_apiserver.fail_next(10**9, status=409)
    for _ in range(3):
        with pytest.raises(client.ApiException) as failed:
            core.list_node()
        assert (failed.value.status, status_body(failed.value)["reason"]) == (409, "Conflict")
    fake_apiserver.fail_next(0)
    assert core.list_node().items == []


def test_requests_are_recorded_with_their_query(fake_apiserver, core):
    since = core.list_node(limit=5).metadata.resource_version
    response = core.list_node(watch=True, resource_version=since, _preload_content=False)
    fake_apiserver.end_watches()
    response.release_conn()
    assert fake_apiserver.requests[0] == RecordedRequest("GET", "/api/v1/nodes", {"limit": "5"})
    assert [r.query for r in fake_apiserver.watch_requests("nodes")] == [{"watch": "true", "resourceVersion": since}]


def test_kubeconfig_points_the_client_at_the_server(fake_apiserver, tmp_path):
    fake_apiserver.put_object("nodes", {"metadata": {"name": "a"}})
    api_client = config.new_client_from_config(config_file=str(write_kubeconfig(fake_apiserver, tmp_path / "kc")))
    assert [n.metadata.name for n in client.CoreV1Api(api_client).list_node().items] == ["a"]
