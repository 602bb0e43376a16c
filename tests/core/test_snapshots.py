"""Inventories: NodeImages/Inventory, node status, the node agent's NodeImages objects, snapshot files."""

import json

import pytest

from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES, NAMES_PER_IMAGE, Inventory, NodeImages, image_key
from image_preflight.core.decide.scheduling import NodeTraits, SchedulingSpecError, Taint
from image_preflight.core.sources.node_status import node_images_from_node
from image_preflight.core.sources.runtime_lists import (
    API_VERSION,
    RUNTIME_KIND,
    format_time,
    node_images_from_runtime,
    parse_time,
    runtime_object,
)
from image_preflight.core.sources.snapshots import SnapshotError, load_snapshot
from tests.builders.nodes import (
    OBSERVED,
    PAUSE,
    PYTHON,
    RUNTIME_IMAGES,
    cri_image,
    docker_line,
    kube_node,
    node_list,
    runtime,
    sha,
    status_image,
)

# --- realistic fixtures ----------------------------------------------------------------------------


def many_images(count: int) -> list[dict]:
    return [status_image(f"registry.example/team/img{i}", "v1", digest=sha("%x" % (i % 16))) for i in range(count)]


SWE = status_image("docker.io/swebench/swesmith.x86_64.owner_1776_repo.abcdef12", "openai")


def load(text: str, **kwargs) -> Inventory:
    return load_snapshot(text, source="snap.json", **kwargs)


# --- image keys and NodeImages -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("python:3.11", "docker.io/library/python:3.11"),
        ("library/python:3.11", "docker.io/library/python:3.11"),
        ("index.docker.io/library/python:3.11", "docker.io/library/python:3.11"),
        ("python", "docker.io/library/python:latest"),
        ("python:3.11@" + sha("1"), "docker.io/library/python@" + sha("1")),
        ("swebench/x:openai", "docker.io/swebench/x:openai"),
        ("localhost:5000/x:v1", "localhost:5000/x:v1"),
    ],
)
def test_image_key_is_the_runtime_lookup_name(spelling, canonical):
    assert image_key(spelling) == canonical


def test_image_key_of_an_image_id_is_the_id():
    # containerd resolves a digest-shaped image as an image ID, not as docker.io/library/sha256:<hex>.
    assert image_key(sha("c")) == sha("c")


def test_node_images_hold_names_in_any_spelling_and_ids():
    node = NodeImages.from_names(
        "n1", ["docker.io/library/python:3.11", "docker.io/library/python@" + sha("1")], ids=[sha("9")]
    )
    assert node.holds(image_key("python:3.11"))
    assert node.holds(image_key("docker.io/library/python:3.11"))
    assert node.holds(image_key("python@" + sha("1")))
    assert node.holds(image_key("python:3.12@" + sha("1")))  # the runtime looks up the digest only
    assert node.holds(image_key(sha("9")))
    assert not node.holds(image_key("python:3.12"))
    assert not node.holds(image_key("python"))
    assert not node.holds(image_key("python@" + sha("2")))


def test_unparseable_runtime_names_are_skipped():
    node = NodeImages.from_names("n1", ["<none>:<none>", "<none>@<none>", "", "x:v1"])
    assert node.refs == {"docker.io/library/x:v1"}


@pytest.mark.parametrize(
    ("complete", "expires_at", "now", "conclusive"),
    [
        (True, None, None, True),
        (True, None, OBSERVED, True),
        (False, None, None, False),
        (True, OBSERVED + 300, OBSERVED + 299, True),
        (True, OBSERVED + 300, OBSERVED + 300, False),  # the lease has run out at expires_at
        (True, OBSERVED + 300, OBSERVED + 301, False),
        (True, OBSERVED + 300, None, True),  # no clock given: the lease is not checked
        (False, OBSERVED + 300, OBSERVED, False),
    ],
)
def test_conclusive(complete, expires_at, now, conclusive):
    node = NodeImages.from_names("n1", ["x:v1"], complete=complete, expires_at=expires_at)
    assert node.conclusive(now) is conclusive


def test_inventory_lookup_and_counts():
    a = NodeImages.from_names("a", ["x:v1", "y:v1"])
    b = NodeImages.from_names("b", ["x:v1"])
    inventory = Inventory((a, b))
    assert len(inventory) == 2
    assert inventory.get("a") is a
    assert inventory.get("c") is None
    assert inventory.image_count == 3
    assert len(Inventory()) == 0


def test_merged_replaces_same_named_nodes_keeps_traits_and_adds_new_ones():
    traits = NodeTraits("a", {"pool": "gpu"}, (Taint("gpu", "true", "NoSchedule"),))
    status_a = NodeImages.from_names("a", ["x:v1"], traits=traits, complete=False, source="node-status")
    status_b = NodeImages.from_names("b", ["x:v1"], traits=NodeTraits("b"), source="node-status")
    runtime_a = NodeImages.from_names("a", ["x:v1", "y:v1"], expires_at=OBSERVED, source="cri")
    runtime_c = NodeImages.from_names("c", ["z:v1"], source="cri")
    merged = Inventory((status_a, status_b)).merged([runtime_a, runtime_c])
    assert [n.node for n in merged.nodes] == ["a", "b", "c"]
    a = merged.get("a")
    assert a.source == "cri" and a.complete and a.expires_at == OBSERVED
    assert a.refs == {"docker.io/library/x:v1", "docker.io/library/y:v1"}
    assert a.traits == traits
    assert merged.get("b") is status_b
    assert merged.get("c").traits is None


def test_merged_override_with_traits_of_its_own_keeps_them():
    old = NodeImages.from_names("a", [], traits=NodeTraits("a", {"zone": "1"}))
    new = NodeImages.from_names("a", [], traits=NodeTraits("a", {"zone": "2"}))
    assert Inventory((old,)).merged([new]).get("a").traits.labels == {"zone": "2"}


# --- node status -------------------------------------------------------------------------------


def test_node_status_reads_names_traits_and_time():
    node = kube_node(
        "worker-1",
        [SWE, PYTHON, PAUSE],
        labels={"pool": "rollout"},
        taints=[{"key": "dedicated", "value": "rollout", "effect": "NoSchedule"}],
        unschedulable=True,
    )
    images = node_images_from_node(node, observed_at=OBSERVED)
    assert images.node == "worker-1"
    assert images.source == "node-status"
    assert images.observed_at == OBSERVED
    assert images.expires_at is None
    assert images.complete
    assert images.refs == {
        "docker.io/swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai",
        "docker.io/library/python:3.11",
        "docker.io/library/python:3.11-slim",
        "docker.io/library/python@" + sha("1"),
        "registry.k8s.io/pause:3.9",
        "registry.k8s.io/pause@" + sha("2"),
    }
    assert images.traits.name == "worker-1"
    assert images.traits.labels["pool"] == "rollout"
    assert images.traits.labels["kubernetes.io/hostname"] == "worker-1"
    assert images.traits.taints == (Taint("dedicated", "rollout", "NoSchedule"),)
    assert images.traits.unschedulable is True


@pytest.mark.parametrize("images", [None, []], ids=["absent", "empty"])
def test_node_without_images_proves_nothing(images):
    """pkg/kubelet/nodestatus/setters.go, Images: a kubelet that could not list its images
    reports none, so an empty list is unknown, not proof that the node holds nothing."""
    node = kube_node("fresh")
    if images is None:
        del node["status"]["images"]
    else:
        node["status"]["images"] = images
    listed = node_images_from_node(node)
    assert listed.refs == frozenset() and not listed.complete


@pytest.mark.parametrize(
    ("count", "max_images", "complete"),
    [
        (DEFAULT_MAX_IMAGES - 1, DEFAULT_MAX_IMAGES, True),
        (DEFAULT_MAX_IMAGES, DEFAULT_MAX_IMAGES, False),  # exactly the cap: more may have been cut
        (DEFAULT_MAX_IMAGES + 1, DEFAULT_MAX_IMAGES, False),
        (9, 10, True),
        (10, 10, False),
        (120, 200, True),
        (200, -1, True),
        (200, None, True),
        (0, 0, False),  # nodeStatusMaxImages 0 reports nothing, so proves nothing
    ],
)
def test_node_status_cap(count, max_images, complete):
    node = kube_node("n1", many_images(count))
    assert node_images_from_node(node, max_images=max_images).complete is complete


@pytest.mark.parametrize(("count", "max_images", "capped", "over_cap"), [
    (49, 50, False, None), (50, 50, True, None), (51, 50, True, 50), (300, 50, True, 50), (300, -1, False, None)])
def test_a_list_longer_than_the_cap_proves_the_cap_wrong(count, max_images, capped, over_cap):
    """pkg/kubelet/nodestatus/setters.go, Images: the kubelet cuts the list at exactly
    nodeStatusMaxImages, so a longer one was not cut at the cap we were told."""
    listed = node_images_from_node(kube_node("n1", many_images(count)), max_images=max_images)
    assert (listed.capped, listed.over_cap, listed.complete) == (capped, over_cap, not capped)


@pytest.mark.parametrize(("annotation", "max_images", "complete"), [
    ("-1", 50, True), ("200", 50, True), ("60", -1, False), ("bogus", 50, False), (None, 200, True)])
def test_a_nodes_own_cap_from_the_dump_wins_over_the_flag(annotation, max_images, complete):
    from image_preflight.core.sources.node_status import CAP_ANNOTATION

    node = kube_node("n1", many_images(60))
    if annotation is not None:
        node["metadata"]["annotations"] = {CAP_ANNOTATION: annotation}
    assert node_images_from_node(node, max_images=max_images).complete is complete


def test_default_cap_is_fifty():
    assert node_images_from_node(kube_node("n1", many_images(50))).complete is False
    assert node_images_from_node(kube_node("n1", many_images(49))).complete is True


@pytest.mark.parametrize(("names", "complete"), [(NAMES_PER_IMAGE - 1, True), (NAMES_PER_IMAGE, False)])
def test_an_image_with_five_names_may_have_lost_some(names, complete):
    crowded = status_image("registry.example/base", *[f"t{i}" for i in range(names - 1)], digest=sha("3"))
    assert len(crowded["names"]) == names
    node = kube_node("n1", [PYTHON, crowded])
    assert node_images_from_node(node).complete is complete


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda n: n["metadata"].pop("name"), r"^metadata\.name: missing$"),
        (lambda n: n.update(metadata=["n1"]), r"^metadata\.name: missing$"),
        (lambda n: n.update(status="Ready"), r"^node n1: status: not an object$"),
        (lambda n: n["status"].update(images={"names": []}), r"^node n1: status\.images: not a list$"),
        (lambda n: n["status"]["images"].append("python:3.11"), r"^node n1: status\.images\[1\]: not an object$"),
        (
            lambda n: n["status"]["images"][0].update(names="python:3.11"),
            r"^node n1: status\.images\[0\]\.names: not a list$",
        ),
        (lambda n: n["spec"].update(taints=[{"key": 5}]), r"^node n1: spec\.taints\[0\]\.key: expected a string"),
    ],
)
def test_malformed_node_names_the_field(mutate, message):
    node = kube_node("n1", [PYTHON])
    mutate(node)
    with pytest.raises(ValueError, match=message):
        node_images_from_node(node)


def test_bad_taints_are_a_scheduling_spec_error():
    node = kube_node("n1", taints=[{"key": "a", "effect": ["NoSchedule"]}])
    with pytest.raises(SchedulingSpecError):
        node_images_from_node(node)


# --- the node agent's NodeImages objects ------------------------------------------------------------


def test_runtime_object_shape():
    obj = runtime()
    assert obj["apiVersion"] == API_VERSION == "image-preflight.io/v1alpha1"
    assert obj["kind"] == RUNTIME_KIND == "NodeImages"
    assert obj["metadata"] == {"name": "worker-1"}
    assert obj["spec"]["nodeName"] == "worker-1"
    assert obj["spec"]["observedAt"] == format_time(OBSERVED)
    assert obj["spec"]["leaseDurationSeconds"] == 300
    assert obj["spec"]["images"] == RUNTIME_IMAGES
    assert obj["spec"]["images"][0] is not RUNTIME_IMAGES[0]  # copied, not shared
    json.dumps(obj)  # serializable as it is


def test_runtime_list_is_complete_with_a_lease():
    images = node_images_from_runtime(runtime(lease=120))
    assert images.node == "worker-1"
    assert images.source == "cri"
    assert images.complete
    assert images.traits is None
    assert images.observed_at == OBSERVED
    assert images.expires_at == OBSERVED + 120
    assert images.ids == {sha("a"), sha("b"), sha("d")}
    assert images.refs == {
        "docker.io/library/python:3.11",
        "docker.io/library/python@" + sha("1"),
        "docker.io/swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai",
        "registry.example/untagged@" + sha("4"),
    }
    assert images.conclusive(OBSERVED + 119)
    assert not images.conclusive(OBSERVED + 120)


def test_runtime_node_name_falls_back_to_metadata_name():
    obj = runtime()
    del obj["spec"]["nodeName"]
    assert node_images_from_runtime(obj).node == "worker-1"


def test_runtime_list_of_a_thousand_images_is_still_complete():
    images = [cri_image(sha("%x" % (i % 16)), [f"docker.io/library/img{i}:v1"]) for i in range(1000)]
    node = node_images_from_runtime(runtime(images=images))
    assert node.complete and len(node.refs) == 1000


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("spec"), r"^spec: missing$"),
        (lambda o: (o["spec"].pop("nodeName"), o.pop("metadata")), r"^spec\.nodeName: missing$"),
        (lambda o: (o["spec"].pop("nodeName"), o.update(metadata="worker-1")), r"^spec\.nodeName: missing$"),
        (lambda o: o["spec"].pop("observedAt"), r"^spec\.observedAt: missing or not an RFC 3339 time$"),
        (
            lambda o: o["spec"].update(observedAt="yesterday"),
            r"^spec\.observedAt: 'yesterday' is not an RFC 3339 time$",
        ),
        (lambda o: o["spec"].pop("leaseDurationSeconds"), r"^spec\.leaseDurationSeconds: "),
        (lambda o: o["spec"].update(leaseDurationSeconds=0), r"^spec\.leaseDurationSeconds: "),
        (lambda o: o["spec"].update(leaseDurationSeconds=-5), r"^spec\.leaseDurationSeconds: "),
        (lambda o: o["spec"].update(leaseDurationSeconds="300"), r"^spec\.leaseDurationSeconds: "),
        (lambda o: o["spec"].update(leaseDurationSeconds=True), r"^spec\.leaseDurationSeconds: "),
        (lambda o: o["spec"].update(images=None), r"^spec\.images: missing or not a list, and no spec\.imageHashes$"),
        (lambda o: o["spec"]["images"].append("python:3.11"), r"^spec\.images\[3\]: not an object$"),
        (lambda o: o["spec"]["images"][1].update(repoTags="x:v1"), r"^spec\.images\[1\]\.repoTags: not a list$"),
        (lambda o: o["spec"]["images"][0].update(repoDigests={}), None),  # empty reads as none
    ],
)
def test_malformed_runtime_object_names_the_field(mutate, message):
    obj = runtime()
    mutate(obj)
    if message is None:
        node_images_from_runtime(obj)
        return
    with pytest.raises(ValueError, match=message):
        node_images_from_runtime(obj)


# --- spec.sandboxImage: the runtime's sandbox (pause) image and whether it holds it ---------------

SANDBOX = "registry.k8s.io/pause:3.10.1"


def test_runtime_object_writes_the_sandbox_report_only_when_given():
    assert "sandboxImage" not in runtime()["spec"]
    obj = runtime_object("worker-1", RUNTIME_IMAGES, observed_at=OBSERVED, lease_seconds=300,
                         sandbox_image={"name": SANDBOX, "present": 0})
    assert obj["spec"]["sandboxImage"] == {"name": SANDBOX, "present": False}
    assert node_images_from_runtime(obj).sandbox_missing == SANDBOX


@pytest.mark.parametrize(("report", "missing"), [
    (None, None),  # the runtime did not say
    ({"name": SANDBOX, "present": True}, None),
    ({"name": SANDBOX, "present": False}, SANDBOX),
])
def test_the_sandbox_report_says_which_sandbox_image_the_runtime_lacks(report, missing):
    obj = runtime()
    if report is not None:
        obj["spec"]["sandboxImage"] = report
    assert node_images_from_runtime(obj).sandbox_missing == missing


def test_every_node_lacking_the_same_sandbox_image_shares_one_string():
    def lacking(node: str) -> NodeImages:
        obj = json.loads(json.dumps(runtime(node)))  # each parse makes its own strings
        obj["spec"]["sandboxImage"] = {"name": "registry.k8s.io/pause:" + "3.10.1", "present": False}
        return node_images_from_runtime(obj)

    assert lacking("worker-1").sandbox_missing is lacking("worker-2").sandbox_missing


def test_a_stale_sandbox_report_proves_nothing():
    obj = runtime(lease=60)
    obj["spec"]["sandboxImage"] = {"name": SANDBOX, "present": False}
    node = node_images_from_runtime(obj)
    assert node.lacks_sandbox(OBSERVED + 59) == SANDBOX
    assert node.lacks_sandbox(OBSERVED + 60) is None


def test_a_sandbox_report_survives_a_snapshot_file_and_the_compact_form():
    from image_preflight.image_set import compact

    obj = runtime()
    obj["spec"]["sandboxImage"] = {"name": SANDBOX, "present": False}
    [node] = load(node_list(kube_node("worker-1", [PYTHON]), obj)).nodes
    assert node.sandbox_missing == SANDBOX and compact(node).sandbox_missing == SANDBOX


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ("registry.k8s.io/pause:3.10.1", r"^spec\.sandboxImage: not an object$"),
        ({"present": False}, r"^spec\.sandboxImage\.name: missing$"),
        ({"name": "", "present": False}, r"^spec\.sandboxImage\.name: missing$"),
        ({"name": ["pause"], "present": False}, r"^spec\.sandboxImage\.name: expected a string, got list$"),
        ({"name": "pause\ud800", "present": False}, r"^spec\.sandboxImage\.name: not valid Unicode"),
        ({"name": "p" * 1025, "present": False}, r"^spec\.sandboxImage\.name: longer than 1024 characters$"),
        ({"name": SANDBOX}, r"^spec\.sandboxImage\.present: missing or not a boolean$"),
        ({"name": SANDBOX, "present": "false"}, r"^spec\.sandboxImage\.present: missing or not a boolean$"),
        ({"name": SANDBOX, "present": 0}, r"^spec\.sandboxImage\.present: missing or not a boolean$"),
    ],
)
def test_a_malformed_sandbox_report_names_the_field(report, message):
    obj = runtime()
    obj["spec"]["sandboxImage"] = report
    with pytest.raises(ValueError, match=message):
        node_images_from_runtime(obj)


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("1970-01-01T00:00:00Z", 0.0),
        ("2026-11-29T19:00:00Z", 1_795_978_800.0),
        ("2026-11-29T20:00:00+01:00", 1_795_978_800.0),
        ("2026-11-29T19:00:00.5Z", 1_795_978_800.5),
        ("2026-11-29T19:00:00", 1_795_978_800.0),  # no zone: UTC
    ],
)
def test_parse_time(text, epoch):
    assert parse_time(text, "f") == epoch


def test_format_time_round_trips_whole_seconds():
    assert format_time(1_795_978_800.0) == "2026-11-29T19:00:00Z"
    assert parse_time(format_time(OBSERVED), "f") == OBSERVED


# --- snapshot files: kubectl get nodes -----------------------------------------------------------


def test_kubectl_get_nodes_list():
    text = node_list(
        kube_node("worker-1", [SWE, PYTHON], labels={"pool": "rollout"}),
        kube_node("worker-2", [PYTHON, PAUSE], taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}]),
    )
    inventory = load(text, observed_at=OBSERVED)
    assert [n.node for n in inventory.nodes] == ["worker-1", "worker-2"]
    w1, w2 = inventory.nodes
    assert w1.holds(image_key("swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai"))
    assert not w2.holds(image_key("swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai"))
    assert w2.holds(image_key("registry.k8s.io/pause:3.9"))
    assert w1.traits.labels["pool"] == "rollout"
    assert w2.traits.taints == (Taint("gpu", "true", "NoSchedule"),)
    assert all(n.complete and n.observed_at == OBSERVED and n.source == "node-status" for n in inventory.nodes)


def test_apiserver_node_list_items_carry_no_kind():
    # GET /api/v1/nodes (and the Python client) leave kind and apiVersion out of list items.
    items = [kube_node("worker-1", [PYTHON]), kube_node("worker-2", [SWE])]
    for item in items:
        del item["kind"], item["apiVersion"]
    inventory = load(node_list(*items, kind="NodeList"))
    assert [n.node for n in inventory.nodes] == ["worker-1", "worker-2"]
    assert inventory.get("worker-2").holds(image_key("swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai"))


def test_single_node():
    inventory = load(json.dumps(kube_node("worker-1", [PYTHON]), indent=2))
    assert len(inventory) == 1
    assert inventory.nodes[0].traits.name == "worker-1"
    assert inventory.nodes[0].holds(image_key("python:3.11-slim"))


def test_empty_node_list_is_an_empty_inventory():
    assert len(load(node_list())) == 0


@pytest.mark.parametrize(
    ("max_images", "complete"), [(DEFAULT_MAX_IMAGES, False), (60, True), (-1, True), (None, True)]
)
def test_cap_is_passed_to_every_node(max_images, complete):
    text = node_list(kube_node("a", many_images(50)), kube_node("b", many_images(50)))
    assert [n.complete for n in load(text, max_images=max_images).nodes] == [complete, complete]


def test_cap_default_marks_only_the_full_node():
    text = node_list(kube_node("full", many_images(50)), kube_node("light", many_images(3)))
    assert [n.complete for n in load(text).nodes] == [False, True]


# --- snapshot files: NodeImages objects, alone and mixed with Nodes --------------------------------


def test_single_runtime_object():
    inventory = load(json.dumps(runtime()), observed_at=OBSERVED + 999)
    [node] = inventory.nodes
    assert node.source == "cri" and node.traits is None
    assert node.observed_at == OBSERVED  # its own time, not the file's
    assert node.expires_at == OBSERVED + 300


def test_runtime_wins_over_node_status_and_keeps_the_node_traits():
    crowded = many_images(50)  # node status is at the cap, so incomplete
    text = node_list(
        kube_node("worker-1", crowded, labels={"pool": "rollout"}),
        runtime("worker-1"),
        kube_node("worker-2", [PYTHON]),
    )
    inventory = load(text, observed_at=OBSERVED)
    assert [n.node for n in inventory.nodes] == ["worker-1", "worker-2"]
    w1 = inventory.get("worker-1")
    assert w1.source == "cri" and w1.complete
    assert w1.holds(image_key("swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai"))
    assert not w1.holds(image_key("registry.example/team/img0:v1"))  # node status' names are replaced
    assert w1.traits is not None and w1.traits.labels["pool"] == "rollout"
    assert inventory.get("worker-2").source == "node-status"


def test_runtime_before_its_node_in_the_list_still_wins():
    text = node_list(runtime("worker-1"), kube_node("worker-1", [PAUSE], labels={"pool": "a"}))
    [w1] = load(text).nodes
    assert w1.source == "cri" and w1.traits.labels["pool"] == "a"


def test_runtime_for_a_node_not_listed_has_no_traits():
    inventory = load(node_list(kube_node("worker-1", [PYTHON]), runtime("worker-9")))
    assert inventory.get("worker-9").traits is None


def test_node_images_list_items_without_kind():
    items = [runtime("worker-1"), runtime("worker-2")]
    for item in items:
        del item["kind"]
    inventory = load(json.dumps({"apiVersion": API_VERSION, "kind": "NodeImagesList", "items": items}))
    assert [n.node for n in inventory.nodes] == ["worker-1", "worker-2"]
    assert all(n.source == "cri" for n in inventory.nodes)


# --- snapshot files: crictl, docker, plain references ----------------------------------------------

CRICTL = json.dumps(
    {
        "images": [
            cri_image(sha("a"), ["docker.io/library/python:3.11"], ["docker.io/library/python@" + sha("1")]),
            cri_image(sha("b"), ["docker.io/swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai"]),
            cri_image(sha("e"), [], [], pinned=True),
            {"id": sha("f"), "repoTags": None, "repoDigests": ["registry.k8s.io/pause@" + sha("2")], "size": "321520"},
        ]
    },
    indent=2,
)


def test_crictl_images():
    inventory = load(CRICTL, observed_at=OBSERVED, node_name="worker-7")
    [node] = inventory.nodes
    assert node.node == "worker-7"
    assert node.source == "crictl"
    assert node.complete and node.traits is None
    assert node.observed_at == OBSERVED and node.expires_at is None
    assert node.ids == {sha("a"), sha("b"), sha("e"), sha("f")}
    assert node.holds(image_key("python:3.11"))
    assert node.holds(image_key("python@" + sha("1")))
    assert node.holds(image_key("registry.k8s.io/pause@" + sha("2")))
    assert node.holds(image_key(sha("e")))  # by id: it has no name at all
    assert not node.holds(image_key("python:3.12"))


def test_crictl_default_node_name():
    assert load(CRICTL).nodes[0].node == "node"


def test_crictl_with_no_images_is_an_empty_node():
    [node] = load('{"images": []}').nodes
    assert node.refs == frozenset() and node.complete


def test_docker_images_lines():
    text = "\n".join(
        [
            docker_line("swebench/swesmith.x86_64.owner_1776_repo.abcdef12", "openai"),
            docker_line("python", "3.11", sha("1")),
            "",
            docker_line("registry.example/untagged", "<none>", sha("4")),
            docker_line("<none>", "<none>"),
        ]
    )
    assert "\\u003cnone\\u003e" in text
    inventory = load(text + "\n", observed_at=OBSERVED, node_name="laptop")
    [node] = inventory.nodes
    assert node.node == "laptop" and node.source == "docker" and node.complete
    assert node.observed_at == OBSERVED
    assert node.refs == {
        "docker.io/swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai",
        "docker.io/library/python:3.11",
        "docker.io/library/python@" + sha("1"),
        "registry.example/untagged@" + sha("4"),
    }


def test_docker_images_single_line():
    [node] = load(docker_line("python", "3.11") + "\n").nodes
    assert node.source == "docker"
    assert node.refs == {"docker.io/library/python:3.11"}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([docker_line("python", "3.11"), "{not json"], r"^snap\.json:2: not JSON "),
        ([docker_line("python", "3.11"), "", '{"Name": "x"}'], r"^snap\.json:3: not a `docker images"),
        ([docker_line("python", "3.11"), "[1, 2]"], r"^snap\.json:2: not a `docker images"),
    ],
)
def test_malformed_docker_line_names_the_line(lines, message):
    with pytest.raises(SnapshotError, match=message):
        load("\n".join(lines))


REFERENCES = """\
# images on the laptop, one per line
swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai

docker.io/library/python:3.11   # fully qualified
  registry.example/team/base@{digest}
busybox
""".format(digest=sha("5"))


def test_reference_lines():
    [node] = load(REFERENCES, observed_at=OBSERVED, node_name="laptop").nodes
    assert node.node == "laptop" and node.source == "text" and node.complete
    assert node.observed_at == OBSERVED
    assert node.refs == {
        "docker.io/swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai",
        "docker.io/library/python:3.11",
        "registry.example/team/base@" + sha("5"),
        "docker.io/library/busybox:latest",
    }


def test_reference_lines_may_be_image_ids():
    # `crictl images -q` prints one image ID per line.
    [node] = load(f"{sha('a')}\n{sha('b')}\n").nodes
    assert node.refs == {sha("a"), sha("b")}
    assert node.holds(image_key(sha("a")))
    assert not node.holds(image_key(sha("c")))


def test_single_reference():
    [node] = load("python:3.11\n").nodes
    assert node.refs == {"docker.io/library/python:3.11"}


def test_bad_reference_names_the_line():
    with pytest.raises(SnapshotError, match=r"^refs\.txt:3: invalid image reference 'Python:3\.11'"):
        load_snapshot("# header\nbusybox:1\nPython:3.11\n", source="refs.txt")


# --- unknown shapes and malformed content ---------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\t\n"])
def test_empty_snapshot(text):
    with pytest.raises(SnapshotError, match=r"^nodes\.json: empty snapshot$"):
        load_snapshot(text, source="nodes.json")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"apiVersion": "v1", "kind": "Pod"}', r"^snap\.json: not a snapshot of a known shape"),
        ('{"nodes": []}', r"^snap\.json: not a snapshot of a known shape"),
        ("[]", r"^snap\.json: a JSON list is not a snapshot"),
        ('[{"kind": "Node"}]', r"^snap\.json: a JSON list is not a snapshot"),
        ('{"kind": "List", "items": {}}', r"^snap\.json: items: not a list$"),
        ('{"kind": "List"}', r"^snap\.json: items: not a list$"),
        ('{"kind": "List", "items": [{"kind": "Pod"}]}',
         r"^snap\.json: items\[0\]: kind 'Pod' is not Node, NodeImages, RuntimeClass or Lease"),
        ('{"kind": "List", "items": [{"metadata": {"name": "n"}}]}', r"^snap\.json: items\[0\]: kind None is not Node"),
        ('{"kind": "List", "items": ["worker-1"]}', r"^snap\.json: items\[0\]: kind None is not Node"),
        ('{"images": ["python:3.11"]}', r"^snap\.json: images\[0\]: not an object$"),
        ('{"images": [{"id": "x", "repoTags": "python:3.11"}]}', r"^snap\.json: images\[0\]\.repoTags: not a list$"),
    ],
)
def test_unknown_or_malformed_shape_names_source_and_field(text, message):
    with pytest.raises(SnapshotError, match=message):
        load(text)


def test_malformed_node_in_a_list_names_source_item_and_field():
    good, bad = kube_node("worker-1", [PYTHON]), kube_node("worker-2", [PYTHON])
    bad["status"]["images"] = "python:3.11"
    with pytest.raises(SnapshotError, match=r"^snap\.json: items\[1\]: node worker-2: status\.images: not a list$"):
        load(node_list(good, bad))


def test_malformed_runtime_in_a_list_names_source_item_and_field():
    bad = runtime("worker-1")
    bad["spec"]["leaseDurationSeconds"] = 0
    with pytest.raises(SnapshotError, match=r"^snap\.json: items\[1\]: spec\.leaseDurationSeconds: "):
        load(node_list(kube_node("worker-1", [PYTHON]), bad))


def test_malformed_single_node_names_source_and_field():
    node = kube_node("worker-1", [PYTHON])
    node["status"]["images"][0]["names"] = "python:3.11"
    with pytest.raises(SnapshotError, match=r"^snap\.json: node worker-1: status\.images\[0\]\.names: not a list$"):
        load(json.dumps(node))


def test_node_with_bad_taints_is_a_snapshot_error():
    node = kube_node("worker-1", taints="gpu=true:NoSchedule")
    with pytest.raises(SnapshotError, match=r"^snap\.json: items\[0\]: node worker-1: spec\.taints: "):
        load(node_list(node))
