"""The node agent: `--print` against a real containerd, and publishing to the in-process double
only for injected error answers; through the real kubernetes client to the real control plane, it
is tests/cluster/test_cluster_agent.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import jsonschema
import pytest

from image_preflight.agent.cri import RuntimeImage
from image_preflight.agent.inventory import (
    CHANGED,
    CREATE,
    fingerprint,
    image_dicts,
    node_images_object,
    publish_reason,
    sandbox_image_report,
)
from image_preflight.agent.publisher import Publisher, PublishError
from image_preflight.cli import main, parse_config
from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION, image_hashes, parse_time
from image_preflight.core.sources.snapshots import load_snapshot
from tests.agent_cluster import ALPHA, DEADLINE_S, NODE, SWE, import_images
from tests.agent_helpers import SAMPLE, T0, image, names_by_id, printed
from tests.containerd import SANDBOX_IMAGE as SANDBOX
from tests.containerd import manifest_digest, tag
from tests.fake_apiserver import FakeApiServer

TOOL = "registry.example.com:5000/team/tool:2.0"


def printed_when(capsys, endpoint: str, done: Callable[[list[dict]], bool]) -> dict:
    """`--print` once the runtime's list satisfies `done` (CRI learns of changes a moment after ctr
    returns), or the last one printed when the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    obj = printed(capsys, endpoint)
    while not done(obj["spec"]["images"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        obj = printed(capsys, endpoint)
    return obj


# -- --print against a real containerd ------------------------------------------------------


def test_print_lists_every_imported_image_with_its_tags_and_digests(containerd, tmp_path, capsys):
    ids = import_images(containerd, tmp_path, [ALPHA, SWE, TOOL])
    tag(containerd.socket, ALPHA, "docker.io/library/alpha:v2")
    by_digest = "docker.io/library/alpha@" + manifest_digest(containerd.socket, ALPHA)
    tag(containerd.socket, ALPHA, by_digest)
    want = {
        ids[ALPHA]: (sorted([ALPHA, "docker.io/library/alpha:v2"]), [by_digest]),
        ids[SWE]: ([SWE], []),
        ids[TOOL]: ([TOOL], []),
    }

    obj = printed_when(capsys, containerd.endpoint, lambda images: names_by_id(images) == want)

    assert (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == (f"{GROUP}/{VERSION}", "NodeImages", NODE)
    spec = obj["spec"]
    assert names_by_id(spec["images"]) == want
    assert [i["id"] for i in spec["images"]] == sorted(ids.values())
    assert all(i["size"] > 0 and i["pinned"] is False for i in spec["images"])
    assert (spec["nodeName"], spec["leaseDurationSeconds"], spec["imageCount"]) == (NODE, 300, 3)
    assert abs(parse_time(spec["observedAt"], "observedAt") - time.time()) < 120
    # The snapshot format the scanner and `serve --inventory` read: complete, from the runtime.
    node = load_snapshot(json.dumps(obj), source="printed").get(NODE)
    assert node is not None and node.complete and node.source == "cri"
    assert {"docker.io/library/alpha:v2", by_digest, TOOL} <= node.refs


def test_print_reports_whether_the_runtime_holds_its_sandbox_image(containerd, tmp_path, capsys):
    assert printed(capsys, containerd.endpoint)["spec"]["sandboxImage"] == {"name": SANDBOX, "present": False}
    import_images(containerd, tmp_path, [SANDBOX])
    obj = printed_when(capsys, containerd.endpoint, lambda images: len(images) == 1)
    assert obj["spec"]["sandboxImage"] == {"name": SANDBOX, "present": True}
    # The runtime's own answer wins over --sandbox-image, which is for runtimes that name none.
    obj = printed(capsys, containerd.endpoint, "--sandbox-image", "registry.k8s.io/pause:3.10")
    assert obj["spec"]["sandboxImage"] == {"name": SANDBOX, "present": True}


def test_print_takes_the_node_from_node_name_and_the_lease_from_the_flag(containerd, capsys, monkeypatch):
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    assert main(["agent", "--print", "--cri-endpoint", containerd.endpoint, "--lease", "90"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["metadata"]["name"], obj["spec"]["leaseDurationSeconds"], obj["spec"]["images"]) == (
        "from-downward-api", 90, [])


def test_print_without_a_runtime_is_a_one_line_error(tmp_path, capsys):
    socket = tmp_path / "absent.sock"
    assert main(["agent", "--print", "--node", NODE, "--cri-endpoint", str(socket)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("image-preflight agent: CRI endpoint ") and str(socket) in err
    assert "\n" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--publish"], "--node: not given and NODE_NAME is not set"),
        (["--publish", "--node", NODE, "--interval", "100"], "below a third of --lease (100 s)"),
        (["--publish", "--node", NODE, "--lease", "0"], "--lease 0: must be 1 to 3600"),
        (["--publish", "--node", NODE, "--lease", "3601"], "--lease 3601: must be 1 to 3600"),
        (["--publish", "--node", NODE, "--pin-needed-images", "a/b", "--pin-max-bytes", "2 Gi"],
         "--pin-max-bytes: '2 Gi' is not a quantity of bytes"),
        (["--publish", "--node", NODE, "--cri-endpoint", "tcp://x:1"], "unsupported CRI endpoint"),
    ],
)
def test_bad_flags_are_named(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["agent", *argv]) == 2
    assert message in capsys.readouterr().err


# -- injected error answers, on the in-process double ----------------------------------------


@pytest.fixture
def double(fake_apiserver: FakeApiServer) -> FakeApiServer:
    fake_apiserver.register(group=GROUP, version=VERSION, resource=PLURAL, kind="NodeImages")
    return fake_apiserver


@pytest.fixture
def double_publisher(double, fake_api_client) -> Publisher:
    return Publisher(fake_api_client, NODE, lease_seconds=30)


def test_an_injected_conflict_is_retried(double, double_publisher):
    double_publisher.publish(SAMPLE, now=T0)
    double.fail_next(1, status=409)
    assert double_publisher.publish(SAMPLE[:1], now=T0 + 1) == CHANGED
    assert double.get_object(PLURAL, NODE, group=GROUP, version=VERSION)["spec"]["images"] == SAMPLE[:1]
    assert [r.method for r in double.requests] == ["GET", "POST", "PUT", "GET", "PUT"]  # the first PUT answered 409


def test_server_errors_raise_one_line_and_the_next_cycle_recovers(double, double_publisher):
    double_publisher.publish(SAMPLE, now=T0)
    double.fail_next(1, status=500, message="etcd is having a bad day")
    with pytest.raises(PublishError) as raised:
        double_publisher.publish(SAMPLE[:1], now=T0 + 1)
    assert str(raised.value) == (f"{PLURAL}/{NODE}: cannot write: HTTP 500 Internal Server Error: "
                                 "etcd is having a bad day")
    assert double_publisher.publish(SAMPLE[:1], now=T0 + 2) == CHANGED
    assert double.get_object(PLURAL, NODE, group=GROUP, version=VERSION)["spec"]["images"] == SAMPLE[:1]


def test_a_steady_cycle_digests_the_image_list_once(double, double_publisher, monkeypatch):
    """The stored object's fingerprint is kept with it; the list's is taken once a cycle and given
    to the publisher (and the pinner): 10,000 images take milliseconds each time."""
    from image_preflight.agent import inventory, publisher

    digested = []
    real = inventory.fingerprint
    monkeypatch.setattr(publisher, "fingerprint", lambda images: digested.append(len(images)) or real(images))
    monkeypatch.setattr(inventory, "fingerprint", lambda images: digested.append(len(images)) or real(images))
    assert double_publisher.publish(SAMPLE, now=T0) == CREATE
    digested.clear()
    for now in (T0 + 1, T0 + 2, T0 + 3):
        assert double_publisher.publish(SAMPLE, now=now, digest=real(SAMPLE)) is None
    assert digested == [len(SAMPLE)], digested  # the stored object's, once: the first time it is compared


def test_fingerprint_ignores_order_and_sees_every_field():
    runtime = [
        RuntimeImage("sha256:" + "b" * 64, (SWE,), (), 2000, False),
        RuntimeImage("sha256:" + "a" * 64, ("docker.io/library/alpha:v2", ALPHA), (), 1000, False),
    ]
    listed = image_dicts(runtime)
    assert [i["id"] for i in listed] == sorted(i.id for i in runtime)
    assert listed[0]["repoTags"] == [ALPHA, "docker.io/library/alpha:v2"]
    assert fingerprint(listed) == fingerprint(image_dicts(reversed(runtime)))
    for changed in ({"pinned": True}, {"size": 1}, {"repoDigests": ["docker.io/library/alpha@sha256:" + "c" * 64]}):
        assert fingerprint([dict(listed[0], **changed), listed[1]]) != fingerprint(listed)


@pytest.mark.parametrize(
    "sandbox, present",
    [
        ("registry.k8s.io/pause:3.9", True),
        ("pause:3.9", True),  # docker.io/library/pause:3.9, as the runtime resolves it
        ("docker.io/library/pause:3.9", True),
        ("docker.io/library/pause", False),  # :latest
        ("registry.k8s.io/pause:3.10", False),
        ("registry.k8s.io/pause@sha256:" + "d" * 64, True),
        ("sha256:" + "c" * 64, True),  # an image ID
        ("sha256:" + "e" * 64, False),
        ("Not/A:Valid:Ref", False),
    ],
)
def test_the_sandbox_image_is_found_by_the_name_the_runtime_resolves(sandbox, present):
    images = [image("sha256:" + "c" * 64, "docker.io/library/pause:3.9"),
              image("sha256:" + "f" * 64, "registry.k8s.io/pause:3.9", "<none>:<none>",
                    digests=("registry.k8s.io/pause@sha256:" + "d" * 64,))]
    assert sandbox_image_report(sandbox, images) == {"name": sandbox, "present": present}


def test_a_changed_sandbox_report_alone_rewrites_the_object():
    absent, present = {"name": SANDBOX, "present": False}, {"name": SANDBOX, "present": True}
    stored = node_images_object(NODE, SAMPLE, observed_at=T0, lease_seconds=30, spec={"sandboxImage": absent})
    assert stored["spec"]["sandboxImage"] == absent
    assert publish_reason(stored, SAMPLE, now=T0 + 1, lease_seconds=30, spec={"sandboxImage": absent}) is None
    assert publish_reason(stored, SAMPLE, now=T0 + 1, lease_seconds=30, spec={"sandboxImage": present}) == CHANGED
    assert publish_reason(stored, SAMPLE, now=T0 + 1, lease_seconds=30) == CHANGED  # no longer known
    unknown = node_images_object(NODE, SAMPLE, observed_at=T0, lease_seconds=30)
    assert "sandboxImage" not in unknown["spec"]
    assert publish_reason(unknown, SAMPLE, now=T0 + 1, lease_seconds=30, spec={"sandboxImage": absent}) == CHANGED


def test_an_apiserver_that_drops_the_sandbox_field_is_not_rewritten_every_cycle(double, double_publisher, caplog,
                                                                                monkeypatch):
    """A CRD from before spec.sandboxImage prunes it from every write."""
    write = Publisher._write

    def pruning(self, body):
        stored = write(self, body)
        stored["spec"].pop("sandboxImage", None)
        return stored

    monkeypatch.setattr(Publisher, "_write", pruning)
    sandbox = {"name": SANDBOX, "present": False}
    assert double_publisher.publish(SAMPLE, now=T0, spec={"sandboxImage": sandbox}) == CREATE
    for now in (T0 + 1, T0 + 2, T0 + 3):
        assert double_publisher.publish(SAMPLE, now=now, spec={"sandboxImage": sandbox}) is None
    assert [r.method for r in double.requests] == ["GET", "POST"]
    (warning,) = [r.getMessage() for r in caplog.records if "sandboxImage" in r.getMessage()]
    assert warning.startswith(f"{PLURAL}/{NODE}: the apiserver dropped spec.sandboxImage")


# -- the chart's agent ----------------------------------------------------------------------


def agent_manifests() -> list[dict]:
    """The chart's defaults, the node agent's objects: the CRD, and those its component label names."""
    from tests.chart import render

    return [d for d in render() if d["kind"] == "CustomResourceDefinition"
            or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "node-agent"]


def manifest(kind: str) -> dict:
    (found,) = [d for d in agent_manifests() if d["kind"] == kind]
    return found


def undeclared(value: object, schema: dict, path: str = "") -> list[str]:
    """Fields the apiserver would prune: not declared in the structural schema."""
    if isinstance(value, dict) and "properties" in schema:
        return [f"{path}.{key}" for key in value if key not in schema["properties"]] + [
            problem for key, item in value.items() if key in schema["properties"]
            for problem in undeclared(item, schema["properties"][key], f"{path}.{key}")]
    if isinstance(value, list) and "items" in schema:
        return [problem for n, item in enumerate(value)
                for problem in undeclared(item, schema["items"], f"{path}[{n}]")]
    return []


def test_the_published_object_fits_the_crd_and_loses_nothing_to_pruning():
    crd = manifest("CustomResourceDefinition")
    assert (crd["metadata"]["name"], crd["spec"]["group"], crd["spec"]["scope"]) == (
        f"{PLURAL}.{GROUP}", GROUP, "Cluster")
    assert (crd["spec"]["names"]["plural"], crd["spec"]["names"]["kind"]) == (PLURAL, "NodeImages")
    (version,) = crd["spec"]["versions"]
    assert version["name"] == VERSION and version["served"] and version["storage"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Node"] == ".spec.nodeName" and columns["Images"] == ".spec.imageCount"
    assert columns["Observed"] == ".spec.observedAt" and columns["Sandbox"] == ".spec.sandboxImage.present"
    schema = version["schema"]["openAPIV3Schema"]

    obj = node_images_object(NODE, SAMPLE, observed_at=T0, lease_seconds=300)
    jsonschema.validate(obj, schema)
    assert undeclared(obj, schema) == []
    with_sandbox = node_images_object(NODE, SAMPLE, observed_at=T0, lease_seconds=300,
                                      spec={"sandboxImage": {"name": SANDBOX, "present": False}})
    jsonschema.validate(with_sandbox, schema)
    assert undeclared(with_sandbox, schema) == []
    for broken in ({"name": SANDBOX}, {"name": "", "present": True}, {"name": SANDBOX, "present": "no"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**obj, "spec": {**obj["spec"], "sandboxImage": broken}}, schema)
    assert undeclared({**obj, "spec": {**obj["spec"], "extra": 1}}, schema) == [".spec.extra"]
    hashed = node_images_object(NODE, SAMPLE, observed_at=T0, lease_seconds=300, hashes=image_hashes(SAMPLE))
    jsonschema.validate(hashed, schema)
    assert undeclared(hashed, schema) == [] and "images" not in hashed["spec"]
    assert obj["metadata"]["name"] == obj["spec"]["nodeName"]  # the CRD's CEL rule
    for broken in ({"images": None}, {"leaseDurationSeconds": 0}, {"observedAt": 5}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**obj, "spec": {**obj["spec"], **broken}}, schema)


def test_the_daemonset_runs_the_agent_on_the_mounted_socket_and_nothing_else_from_the_host(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    daemonset = manifest("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert container["command"] == ["image-preflight"] and type(args).__name__ == "AgentConfig" and args.publish
    assert 0 < args.interval < args.lease / 3
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"] and mount["readOnly"] is True
    assert volume["hostPath"] == {"path": mount["mountPath"], "type": "Socket"}
    assert args.cri_endpoint == "unix://" + mount["mountPath"]
    (env,) = container["env"]
    assert env == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    # Where agent-lightning's rollout Pods may land: every node without a NoSchedule or NoExecute
    # taint, which is where a DaemonSet without tolerations runs.
    assert "nodeSelector" not in pod and "tolerations" not in pod
    # Not root: the socket's group (root, 0660) is enough.
    assert pod["securityContext"]["runAsUser"] != 0 and pod["securityContext"]["supplementalGroups"] == [0]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
    assert context["capabilities"] == {"drop": ["ALL"]} and context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == manifest("ServiceAccount")["metadata"]["name"]


def test_the_agent_may_touch_nodeimages_and_nothing_else():
    # What agent/publisher.py calls, and no more: no list or watch of other nodes' lists, no patch;
    # and its write policy and binding, read by name at start (--write-policy).
    rule, policy = manifest("ClusterRole")["rules"]
    assert rule == {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "create", "update"]}
    assert policy == {"apiGroups": ["admissionregistration.k8s.io"],
                      "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
                      "resourceNames": ["image-preflight-agent-own-node"], "verbs": ["get"]}
    binding = manifest("ClusterRoleBinding")
    account = manifest("ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}]
    namespace = manifest("Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"  # hostPath
    namespaced = [d for d in agent_manifests() if d["kind"] not in (
        "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {namespace["metadata"]["name"]}
