"""The in-process apiserver, exercised through the official kubernetes client."""

from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes import client, config, watch

from tests.fake_apiserver import FakeApiServer, make_api_client, write_kubeconfig

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


@pytest.fixture
def core(fake_api_client) -> client.CoreV1Api:
    return client.CoreV1Api(fake_api_client)


def test_create_stamps_metadata_and_get_returns_it(core):
    created = core.create_node({"metadata": {"name": "a"}})
    fetched = core.read_node("a")
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert fetched.metadata.uid == created.metadata.uid
    assert fetched.metadata.resource_version == created.metadata.resource_version
    second = core.create_node({"metadata": {"name": "b"}})
    assert int(second.metadata.resource_version) > int(created.metadata.resource_version)


def test_errors_are_status_objects_with_the_right_code(core):
    core.create_node({"metadata": {"name": "a"}})
    with pytest.raises(client.ApiException) as exists:
        core.create_node({"metadata": {"name": "a"}})
    assert exists.value.status == 409
    assert status_body(exists.value)["reason"] == "AlreadyExists"

    with pytest.raises(client.ApiException) as missing:
        core.read_node("nope")
    body = status_body(missing.value)
    assert missing.value.status == 404
    assert (body["kind"], body["status"], body["reason"], body["code"]) == ("Status", "Failure", "NotFound", 404)


def test_replace_with_a_stale_resource_version_conflicts(core):
    created = core.create_node({"metadata": {"name": "a"}})
    core.patch_node("a", {"metadata": {"labels": {"x": "1"}}})
    stale = {"metadata": {"name": "a", "resourceVersion": created.metadata.resource_version}}
    with pytest.raises(client.ApiException) as conflict:
        core.replace_node("a", stale)
    assert conflict.value.status == 409
    assert status_body(conflict.value)["reason"] == "Conflict"
    fresh = {"metadata": {"name": "a", "resourceVersion": core.read_node("a").metadata.resource_version}}
    assert core.replace_node("a", fresh).metadata.labels is None


def test_patch_merges_objects_and_applies_json_patch_lists(core):
    core.create_node({"metadata": {"name": "a", "labels": {"keep": "1", "drop": "1"}}})
    merged = core.patch_node("a", {"metadata": {"labels": {"drop": None, "new": "2"}}})
    assert merged.metadata.labels == {"keep": "1", "new": "2"}
    patched = core.patch_node("a", [{"op": "replace", "path": "/metadata/labels/keep", "value": "3"}])
    assert patched.metadata.labels == {"keep": "3", "new": "2"}


def test_list_filters_by_label_and_field_selector(core):
    core.create_node({"metadata": {"name": "a", "labels": {"pool": "gpu"}}})
    core.create_node({"metadata": {"name": "b", "labels": {"pool": "cpu"}}})
    core.create_node({"metadata": {"name": "c"}})
    names = lambda result: [n.metadata.name for n in result.items]  # noqa: E731
    assert names(core.list_node(label_selector="pool=gpu")) == ["a"]
    assert names(core.list_node(label_selector="pool in (gpu,cpu),pool!=cpu")) == ["a"]
    assert names(core.list_node(label_selector="!pool")) == ["c"]
    assert names(core.list_node(field_selector="metadata.name=b")) == ["b"]
    listing = core.list_node()
    assert names(listing) == ["a", "b", "c"]
    assert listing.metadata.resource_version == "3"


def test_custom_objects_are_namespaced_and_listable_across_namespaces(fake_apiserver, fake_api_client):
    fake_apiserver.register(group=GROUP, version=VERSION, resource=PLURAL, kind="NodeImages", namespaced=True)
    custom = client.CustomObjectsApi(fake_api_client)
    for ns in ("one", "two"):
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeImages", "metadata": {"name": "n1"}, "spec": {}}
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    got = custom.get_namespaced_custom_object(GROUP, VERSION, "two", PLURAL, "n1")
    assert got["metadata"]["namespace"] == "two"
    everywhere = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert everywhere["kind"] == "NodeImagesList"
    assert [o["metadata"]["namespace"] for o in everywhere["items"]] == ["one", "two"]
    custom.delete_namespaced_custom_object(GROUP, VERSION, "one", PLURAL, "n1")
    with pytest.raises(client.ApiException) as missing:
        custom.get_namespaced_custom_object(GROUP, VERSION, "one", PLURAL, "n1")
    assert missing.value.status == 404


def test_watch_replays_events_after_the_given_resource_version(fake_apiserver, core):
    core.create_node({"metadata": {"name": "a"}})
    since = core.create_node({"metadata": {"name": "b"}}).metadata.resource_version
    core.patch_node("a", {"metadata": {"labels": {"x": "1"}}})
    core.delete_node("b")
    events = list(watch.Watch().stream(core.list_node, resource_version=since, timeout_seconds=1))
    assert [(e["type"], e["raw_object"]["metadata"]["name"]) for e in events] == [("MODIFIED", "a"), ("DELETED", "b")]
    assert events[-1]["raw_object"]["metadata"]["resourceVersion"] == str(fake_apiserver.resource_version)


def test_watch_without_resource_version_starts_with_synthetic_added(core):
    core.create_node({"metadata": {"name": "a"}})
    core.create_node({"metadata": {"name": "b"}})
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in raw_events(core, timeout_seconds=1)] == [
        ("ADDED", "a"), ("ADDED", "b")]


def test_watch_from_before_compaction_gets_an_in_band_410(fake_apiserver, core):
    since = core.create_node({"metadata": {"name": "a"}}).metadata.resource_version
    core.create_node({"metadata": {"name": "b"}})
    fake_apiserver.compact()
    events = raw_events(core, resource_version=since, timeout_seconds=5)
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    with pytest.raises(client.ApiException) as gone:
        list(watch.Watch().stream(core.list_node, resource_version=since, timeout_seconds=5))
    assert gone.value.status == 410


def test_history_window_expires_old_resource_versions():
    with FakeApiServer(history_size=2) as server:
        server.register(resource="nodes", kind="Node", namespaced=False)
        for name in "abcd":
            server.put_object("nodes", {"metadata": {"name": name}})
        with make_api_client(server) as api_client:
            api = client.CoreV1Api(api_client)
            assert raw_events(api, resource_version="1", timeout_seconds=1)[0]["object"]["code"] == 410
            replay = raw_events(api, resource_version="2", timeout_seconds=1)
        assert [e["object"]["metadata"]["name"] for e in replay] == ["c", "d"]


def test_bookmarks_carry_the_current_resource_version(fake_apiserver, core):
    fake_apiserver.register(resource="configmaps", kind="ConfigMap", namespaced=True)
    core.create_node({"metadata": {"name": "a"}})
    fake_apiserver.put_object("configmaps", {"metadata": {"name": "c", "namespace": "default"}})
    response = core.list_node(watch=True, resource_version="1", allow_watch_bookmarks=True, timeout_seconds=10,
                              _preload_content=False)
    event = None
    try:
        for chunk in response.stream(amt=None):
            event = json.loads(chunk)
            if event["type"] == "BOOKMARK":
                break
    finally:
        response.close()
        response.release_conn()
    assert event is not None and event["object"] == {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": "2"}}


def test_selector_changes_become_added_and_deleted_for_a_watcher(fake_apiserver, core):
    core.create_node({"metadata": {"name": "a", "labels": {"pool": "cpu"}}})
    core.patch_node("a", {"metadata": {"labels": {"pool": "gpu"}}})
    core.patch_node("a", {"metadata": {"labels": {"pool": "cpu"}}})
    events = raw_events(core, resource_version="1", label_selector="pool=gpu", timeout_seconds=1)
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]


def test_dropped_watch_breaks_the_clients_stream(fake_apiserver, core):
    core.create_node({"metadata": {"name": "a"}})
    response = core.list_node(watch=True, _preload_content=False)
    stream = response.stream(amt=None)
    assert json.loads(next(stream))["type"] == "ADDED"
    fake_apiserver.drop_watches()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        next(stream)
    response.release_conn()


def test_fail_next_answers_errors_then_heals(fake_apiserver, core):
    fake_apiserver.fail_next(2, status=503)
    for _ in range(2):
        with pytest.raises(client.ApiException) as failed:
            core.list_node()
        assert failed.value.status == 503
        assert status_body(failed.value)["reason"] == "ServiceUnavailable"
    assert core.list_node().items == []
    assert [(r.method, r.path) for r in fake_apiserver.requests] == [("GET", "/api/v1/nodes")] * 3


def test_requests_are_recorded_with_their_query(fake_apiserver, core):
    core.list_node(label_selector="a=b,c in (d,e)", limit=5)
    request = fake_apiserver.requests[-1]
    assert request.query == {"labelSelector": "a=b,c in (d,e)", "limit": "5"}


def test_kubeconfig_points_the_client_at_the_server(fake_apiserver, tmp_path):
    fake_apiserver.put_object("nodes", {"metadata": {"name": "a"}})
    api_client = config.new_client_from_config(config_file=str(write_kubeconfig(fake_apiserver, tmp_path / "kc")))
    assert [n.metadata.name for n in client.CoreV1Api(api_client).list_node().items] == ["a"]


def test_status_subresource_separates_status_from_the_rest(fake_apiserver, fake_api_client):
    fake_apiserver.register(group=GROUP, version=VERSION, resource=PLURAL, kind="NodeImages", namespaced=False,
                            status_subresource=True)
    custom = client.CustomObjectsApi(fake_api_client)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, {"metadata": {"name": "n1"}, "spec": {"a": 1}})
    main = custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, "n1", {"spec": {"a": 2}, "status": {"x": 1}})
    assert main["spec"] == {"a": 2} and "status" not in main
    status = custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, "n1", {"spec": {"a": 3}, "status": {"x": 1}})
    assert status["spec"] == {"a": 2} and status["status"] == {"x": 1}
