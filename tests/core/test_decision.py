import json

import pytest

from image_preflight.core.decide.decision import (
    INVALID,
    MISSING,
    NOT_CHECKED,
    PRESENT,
    REQUIRE_ALL,
    REQUIRE_ANY,
    UNKNOWN,
    Outcome,
    decide,
    decide_images,
    eligible_nodes,
)
from image_preflight.core.decide.scheduling import REASON_AFFINITY, PodPlacement, SchedulingSpecError, Taint
from image_preflight.core.decide.workloads import ContainerImage, WorkloadError, pod_spec_of
from image_preflight.core.sources.snapshots import load_snapshot
from tests.builders.inventories import NOW, SWE, inv, node, pod
from tests.builders.nodes import PAUSE, PYTHON, cri_image, kube_node, node_list, runtime, status_image

DIGEST = "sha256:" + "d" * 64


def statuses(decision):
    return [v.status for v in decision.verdicts]


# --- per image -------------------------------------------------------------------------------------


def test_present_on_every_eligible_node():
    decision = decide(pod(SWE), inv(node("a", SWE), node("b", "docker.io/" + SWE)))
    assert decision.outcome == Outcome.ALLOW
    [verdict] = decision.verdicts
    assert verdict.status == PRESENT
    assert verdict.key == "docker.io/" + SWE
    assert verdict.missing_on == () and verdict.unknown_on == ()
    assert decision.eligible == ("a", "b")


def test_missing_on_one_node_denies_by_default():
    decision = decide(pod(SWE), inv(node("a", SWE), node("b", "python:3.11"), node("c", SWE)))
    assert decision.outcome == Outcome.DENY
    [verdict] = decision.verdicts
    assert verdict.status == MISSING
    assert verdict.missing_on == ("b",)


def test_missing_everywhere_lists_every_node():
    decision = decide(pod(SWE), inv(node("a"), node("b")))
    assert decision.outcome == Outcome.DENY
    assert decision.verdicts[0].missing_on == ("a", "b")


def test_require_any_relaxes():
    inventory = inv(node("a", SWE), node("b"))
    assert decide(pod(SWE), inventory, require=REQUIRE_ALL).outcome == Outcome.DENY
    decision = decide(pod(SWE), inventory, require=REQUIRE_ANY)
    assert decision.outcome == Outcome.ALLOW
    assert decision.verdicts[0].status == PRESENT
    assert decision.verdicts[0].missing_on == ("b",)


def test_require_any_missing_everywhere_denies():
    decision = decide(pod(SWE), inv(node("a"), node("b")), require=REQUIRE_ANY)
    assert decision.outcome == Outcome.DENY
    assert decision.verdicts[0].status == MISSING


def test_require_any_with_an_inconclusive_node_is_unknown():
    decision = decide(pod(SWE), inv(node("a"), node("b", complete=False)), require=REQUIRE_ANY)
    assert decision.outcome == Outcome.UNKNOWN
    assert decision.verdicts[0].status == UNKNOWN
    assert decision.verdicts[0].unknown_on == ("b",)
    assert decision.verdicts[0].missing_on == ("a",)


def test_require_must_be_all_or_any():
    with pytest.raises(ValueError, match="require: 'most'"):
        decide(pod(SWE), inv(node("a", SWE)), require="most")


def test_truncated_node_makes_absence_unknown_never_missing():
    decision = decide(pod(SWE), inv(node("a", SWE), node("b", "python:3.11", complete=False)))
    assert decision.outcome == Outcome.UNKNOWN
    [verdict] = decision.verdicts
    assert verdict.status == UNKNOWN
    assert verdict.unknown_on == ("b",) and verdict.missing_on == ()


def test_truncated_node_holding_the_image_counts_as_present():
    decision = decide(pod(SWE), inv(node("a", SWE, complete=False)))
    assert decision.outcome == Outcome.ALLOW


def test_missing_on_a_complete_node_outweighs_unknown_on_a_truncated_one():
    decision = decide(pod(SWE), inv(node("a"), node("b", complete=False)))
    assert decision.outcome == Outcome.DENY
    verdict = decision.verdicts[0]
    assert verdict.status == MISSING
    assert verdict.missing_on == ("a",) and verdict.unknown_on == ("b",)


@pytest.mark.parametrize(
    ("now", "status", "outcome"),
    [
        (NOW - 1, MISSING, Outcome.DENY),
        (NOW, UNKNOWN, Outcome.UNKNOWN),  # the lease ends at expires_at
        (NOW + 3600, UNKNOWN, Outcome.UNKNOWN),
    ],
)
def test_expired_lease_makes_absence_unknown(now, status, outcome):
    decision = decide(pod(SWE), inv(node("a", "python:3.11", expires_at=NOW)), now=now)
    assert decision.verdicts[0].status == status
    assert decision.outcome == outcome


def test_expired_lease_still_proves_presence():
    decision = decide(pod(SWE), inv(node("a", SWE, expires_at=NOW)), now=NOW + 3600)
    assert decision.outcome == Outcome.ALLOW


@pytest.mark.parametrize("policy", ["Always", None])
def test_always_is_not_checked(policy):
    image = SWE.replace(":openai", ":latest") if policy is None else SWE  # None: defaulted to Always
    decision = decide(pod((image, policy)), inv(node("a"), node("b", complete=False)))
    assert decision.outcome == Outcome.ALLOW
    [verdict] = decision.verdicts
    assert verdict.status == NOT_CHECKED
    assert verdict.image.pull_policy == "Always"
    assert verdict.missing_on == () and verdict.unknown_on == ()


@pytest.mark.parametrize(("names", "outcome"), [((SWE,), Outcome.ALLOW), ((), Outcome.DENY)])
def test_never_is_checked_like_if_not_present(names, outcome):
    decision = decide(pod(SWE, policy="Never"), inv(node("a", *names)))
    assert decision.outcome == outcome
    assert decision.verdicts[0].status == (PRESENT if names else MISSING)


def test_defaulted_policy_is_checked():
    decision = decide(pod(SWE, policy=None), inv(node("a")))
    assert decision.verdicts[0].image.pull_policy == "IfNotPresent"
    assert decision.outcome == Outcome.DENY


@pytest.mark.parametrize("policy", ["Always", "IfNotPresent", "Never"])
@pytest.mark.parametrize("image", [":openai", "swebench/X:openai", "x:" + "t" * 129, "a" * 64])
def test_invalid_reference_denies(image, policy):
    decision = decide(pod(image, policy=policy), inv(node("a")))
    assert decision.outcome == Outcome.DENY
    [verdict] = decision.verdicts
    assert verdict.status == INVALID
    assert verdict.key is None
    assert "invalid image reference" in verdict.detail


def test_invalid_reference_denies_even_without_eligible_nodes():
    decision = decide(pod(":openai"), inv())
    assert decision.outcome == Outcome.DENY
    assert decision.images(INVALID).images == (":openai",)


def test_reference_spellings_match_node_names():
    held = node(
        "a",
        "docker.io/library/python:3.11",
        "docker.io/library/busybox:latest",
        "registry.example/team/base@" + DIGEST,
    )
    spec = pod(
        "python:3.11",
        "index.docker.io/library/python:3.11",
        ("busybox", "IfNotPresent"),  # no tag: the runtime looks up :latest
        "registry.example/team/base@" + DIGEST,
        "registry.example/team/base:v9@" + DIGEST,  # the tag is dropped beside a digest
        policy="IfNotPresent",
    )
    decision = decide(spec, inv(held))
    assert statuses(decision) == [PRESENT] * 5
    assert decision.outcome == Outcome.ALLOW


def test_digest_is_not_satisfied_by_the_tag():
    decision = decide(pod("python@" + DIGEST), inv(node("a", "docker.io/library/python:3.11")))
    assert decision.outcome == Outcome.DENY


def test_image_id_is_found_among_the_node_ids():
    decision = decide(pod(DIGEST), inv(node("a", "python:3.11", ids=[DIGEST])))
    assert decision.verdicts[0].image.pull_policy == "IfNotPresent"
    assert decision.verdicts[0].status == PRESENT
    assert decision.outcome == Outcome.ALLOW
    assert decide(pod("sha256:" + "e" * 64), inv(node("a", ids=[DIGEST]))).outcome == Outcome.DENY


# --- outcome across images ---------------------------------------------------------------------


def test_every_container_field_counts():
    spec = {
        "initContainers": [{"name": "setup", "image": "setup:v1", "imagePullPolicy": "IfNotPresent"}],
        "containers": [{"name": "main", "image": SWE, "imagePullPolicy": "IfNotPresent"}],
        "ephemeralContainers": [{"name": "dbg", "image": "debug:v1", "imagePullPolicy": "IfNotPresent"}],
    }
    decision = decide(spec, inv(node("a", SWE, "debug:v1")))
    assert statuses(decision) == [MISSING, PRESENT, PRESENT]
    assert [v.image.container for v in decision.verdicts] == ["setup", "main", "dbg"]
    assert decision.outcome == Outcome.DENY
    assert decision.images(MISSING).images == ("setup:v1",)


@pytest.mark.parametrize(
    ("names", "complete", "expected_statuses", "outcome"),
    [
        ((SWE, "python:3.11"), True, [PRESENT, PRESENT, NOT_CHECKED], Outcome.ALLOW),
        ((SWE,), True, [PRESENT, MISSING, NOT_CHECKED], Outcome.DENY),
        ((SWE,), False, [PRESENT, UNKNOWN, NOT_CHECKED], Outcome.UNKNOWN),
        ((), False, [UNKNOWN, UNKNOWN, NOT_CHECKED], Outcome.UNKNOWN),
    ],
)
def test_outcome_combines_images(names, complete, expected_statuses, outcome):
    spec = pod(SWE, "python:3.11", ("python:latest", None))
    decision = decide(spec, inv(node("a", *names, complete=complete)))
    assert statuses(decision) == expected_statuses
    assert decision.outcome == outcome


def test_invalid_outweighs_missing_and_unknown():
    spec = pod("Bad:v1", SWE, "python:3.11")
    decision = decide(spec, inv(node("a"), node("b", complete=False)))
    assert statuses(decision) == [INVALID, MISSING, MISSING]
    assert decision.outcome == Outcome.DENY


def test_no_images_at_all_is_allowed():
    assert decide({"containers": []}, inv()).outcome == Outcome.ALLOW


# --- eligibility -------------------------------------------------------------------------------


def test_node_selector_restricts_which_nodes_count():
    inventory = inv(
        node("rollout-1", SWE, labels={"pool": "rollout"}),
        node("rollout-2", SWE, labels={"pool": "rollout"}),
        node("system-1", labels={"pool": "system"}),
    )
    assert decide(pod(SWE), inventory).outcome == Outcome.DENY
    decision = decide(pod(SWE, nodeSelector={"pool": "rollout"}), inventory)
    assert decision.outcome == Outcome.ALLOW
    assert decision.eligible == ("rollout-1", "rollout-2")
    assert decision.ineligible == ((REASON_AFFINITY, 1),)


def test_untolerated_taint_excludes_a_node_and_a_toleration_brings_it_back():
    gpu = Taint("nvidia.com/gpu", "present", "NoSchedule")
    inventory = inv(node("cpu-1", SWE), node("gpu-1", taints=[gpu]))
    decision = decide(pod(SWE), inventory)
    assert decision.outcome == Outcome.ALLOW
    assert decision.eligible == ("cpu-1",)
    assert decision.ineligible == (("node(s) had untolerated taint {nvidia.com/gpu: present}", 1),)
    tolerating = pod(SWE, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    decision = decide(tolerating, inventory)
    assert decision.outcome == Outcome.DENY
    assert decision.verdicts[0].missing_on == ("gpu-1",)


def test_prefer_no_schedule_does_not_exclude():
    soft = Taint("spot", "true", "PreferNoSchedule")
    assert decide(pod(SWE), inv(node("a", SWE), node("b", taints=[soft]))).outcome == Outcome.DENY


def test_no_eligible_node():
    inventory = inv(node("a", SWE, labels={"pool": "system"}), node("b", SWE, labels={"pool": "system"}))
    decision = decide(pod(SWE, nodeSelector={"pool": "rollout"}), inventory)
    assert decision.outcome == Outcome.NO_ELIGIBLE_NODE
    assert decision.eligible == ()
    assert decision.ineligible == ((REASON_AFFINITY, 2),)
    assert decision.verdicts[0].status == UNKNOWN


def test_empty_inventory_has_no_eligible_node():
    decision = decide(pod(SWE), inv())
    assert decision.outcome == Outcome.NO_ELIGIBLE_NODE
    assert decision.ineligible == ()


def test_only_always_images_are_allowed_without_an_eligible_node():
    spec = pod(("python:latest", None), ("busybox", "Always"), nodeSelector={"pool": "nowhere"})
    for inventory in (inv(), inv(node("a", labels={"pool": "system"}))):
        decision = decide(spec, inventory)
        assert decision.outcome == Outcome.ALLOW
        assert statuses(decision) == [NOT_CHECKED, NOT_CHECKED]


def test_nodes_without_traits_are_always_eligible():
    inventory = inv(node("laptop", SWE, traits=False))
    spec = pod(
        SWE,
        nodeName="elsewhere",
        nodeSelector={"pool": "rollout"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
                }
            }
        },
    )
    decision = decide(spec, inventory)
    assert decision.eligible == ("laptop",)
    assert decision.outcome == Outcome.ALLOW
    assert decide(pod("python:3.11", nodeSelector={"pool": "rollout"}), inventory).outcome == Outcome.DENY


def test_eligible_nodes_counts_reasons():
    inventory = inv(
        node("a", labels={"pool": "rollout"}),
        node("b", labels={"pool": "system"}),
        node("c", labels={"pool": "system"}),
        node("d", traits=False),
    )
    eligible, reasons = eligible_nodes(PodPlacement.from_pod_spec({"nodeSelector": {"pool": "rollout"}}), inventory)
    assert [n.node for n in eligible] == ["a", "d"]
    assert dict(reasons) == {REASON_AFFINITY: 2}


def test_decide_images_takes_prepared_images():
    images = [ContainerImage("main", "containers", SWE, "IfNotPresent")]
    decision = decide_images(images, PodPlacement(), inv(node("a", SWE)))
    assert decision.outcome == Outcome.ALLOW
    assert decision.verdicts[0].image is images[0]


def test_unreadable_spec_raises():
    with pytest.raises(WorkloadError, match=r"^spec\.containers\[0\]\.image"):
        decide({"containers": [{"name": "c"}]}, inv(node("a")))
    with pytest.raises(SchedulingSpecError, match=r"^spec\.nodeSelector"):
        decide(pod(SWE, nodeSelector=["pool=rollout"]), inv(node("a")))


# --- end to end: a rollout Job against snapshots ---------------------------------------------------


def rollout_job(image, **pod_fields):
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rollout-0", "labels": {"app.kubernetes.io/managed-by": "agentlightning"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "sandbox", "image": image, "imagePullPolicy": "IfNotPresent"}],
                    **pod_fields,
                }
            },
        },
    }


def cluster_snapshot(*extra_items):
    swe = status_image("docker.io/swebench/swesmith.x86_64.owner_1776_repo.abcdef12", "openai", size=2_100_000_000)
    other = status_image("docker.io/swebench/swesmith.x86_64.other_1776_repo.12345678", "openai")
    items = [
        kube_node("rollout-1", [swe, PYTHON, PAUSE], labels={"pool": "rollout"}),
        kube_node("rollout-2", [other, PYTHON, PAUSE], labels={"pool": "rollout"}),
        kube_node(
            "control-plane",
            [PAUSE],
            labels={"node-role.kubernetes.io/control-plane": ""},
            taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
        ),
        *extra_items,
    ]
    return load_snapshot(node_list(*items), source="nodes.json", observed_at=NOW)


def test_job_against_kubectl_nodes():
    inventory = cluster_snapshot()
    decision = decide(pod_spec_of(rollout_job(SWE)), inventory)
    assert decision.eligible == ("rollout-1", "rollout-2")  # the control plane's taint keeps it out
    assert decision.outcome == Outcome.DENY
    assert decision.verdicts[0].missing_on == ("rollout-2",)
    assert decide(pod_spec_of(rollout_job(SWE)), inventory, require=REQUIRE_ANY).outcome == Outcome.ALLOW
    pinned = rollout_job(SWE, nodeSelector={"kubernetes.io/hostname": "rollout-1"})
    assert decide(pod_spec_of(pinned), inventory).outcome == Outcome.ALLOW


def test_job_against_nodes_and_a_runtime_list():
    # rollout-2's runtime list (complete, leased) shows the image that node status did not.
    agent = runtime("rollout-2", [cri_image("sha256:" + "b" * 64, ["docker.io/" + SWE])], lease=300, observed_at=NOW)
    inventory = cluster_snapshot(agent)
    spec = pod_spec_of(rollout_job(SWE))
    decision = decide(spec, inventory, now=NOW + 10)
    assert decision.outcome == Outcome.ALLOW
    assert decision.eligible == ("rollout-1", "rollout-2")  # rollout-2 kept its labels and taints
    # Once the lease has run out, a name the runtime list lacks proves nothing.
    later = decide(pod_spec_of(rollout_job("python:3.12")), inventory, now=NOW + 300)
    assert later.verdicts[0].missing_on == ("rollout-1",)
    assert later.verdicts[0].unknown_on == ("rollout-2",)
    assert later.outcome == Outcome.DENY


def test_job_against_a_truncated_node_list():
    crowded = [status_image(f"registry.example/team/img{i}", "v1") for i in range(50)]
    inventory = load_snapshot(node_list(kube_node("big", crowded)), source="nodes.json")
    decision = decide(pod_spec_of(rollout_job(SWE)), inventory)
    assert decision.outcome == Outcome.UNKNOWN
    assert decision.verdicts[0].unknown_on == ("big",)


def test_job_against_a_single_node_crictl_snapshot():
    crictl = json.dumps({"images": [cri_image("sha256:" + "c" * 64, ["docker.io/" + SWE])]})
    inventory = load_snapshot(crictl, source="worker.json", node_name="worker")
    # A single-node snapshot has no traits, so the Job's selector cannot exclude it.
    spec = pod_spec_of(rollout_job(SWE, nodeSelector={"pool": "rollout"}))
    assert decide(spec, inventory).outcome == Outcome.ALLOW
    assert decide(pod_spec_of(rollout_job("python:3.11")), inventory).outcome == Outcome.DENY


def test_an_image_id_is_unknown_against_node_status_and_decided_by_a_runtime_list():
    """pkg/kubelet/nodestatus/setters.go, Images: node status lists RepoDigests and RepoTags, never
    the image ID the runtime resolves `sha256:<hex>` by; only a list carrying IDs can prove it absent."""
    status = node("n1", SWE)  # from node status: names only
    assert statuses(decide(pod(DIGEST), inv(status))) == [UNKNOWN]
    runtime_list = node("n1", SWE, ids=["sha256:" + "e" * 64])
    assert statuses(decide(pod(DIGEST), inv(runtime_list))) == [MISSING]
    assert statuses(decide(pod(DIGEST), inv(node("n1", SWE, ids=[DIGEST])))) == [PRESENT]


def test_a_missing_image_volume_denies_and_is_named_as_a_volume():
    from image_preflight.core.admission.messages import denial_message

    spec = pod(SWE, volumes=[{"name": "tools", "image": {"reference": "swe/tools:v1"}}])
    spec["containers"][0]["volumeMounts"] = [{"name": "tools", "mountPath": "/tools"}]
    decision = decide(spec, inv(node("n1", SWE)))
    assert decision.outcome == Outcome.DENY and statuses(decision) == [PRESENT, MISSING]
    assert "image 'swe/tools:v1' (volume 'tools', imagePullPolicy IfNotPresent) is absent" in denial_message(decision)


def test_a_missing_image_volume_no_container_mounts_is_allowed():
    """The kubelet's failed pull of it holds back no container (kuberuntime_manager.go,
    toKubeContainerImageVolumes): the pod runs."""
    spec = pod(SWE, volumes=[{"name": "tools", "image": {"reference": "swe/tools:v1"}}])
    decision = decide(spec, inv(node("n1", SWE)))
    assert decision.outcome == Outcome.ALLOW and statuses(decision) == [PRESENT]


# --- remembered decisions (image_preflight.core.decide.memory) ------------------------------------


def _specs() -> list[dict]:
    containers = [{"name": "agent", "image": SWE, "imagePullPolicy": "IfNotPresent"}]
    return [
        {"containers": containers},
        {"containers": [{**containers[0], "name": "other"}]},  # names only label messages, yet they differ
        {"containers": containers, "nodeSelector": {"pool": "cpu"}},
        {"containers": containers, "nodeSelector": {"pool": "gpu"}},
        {"containers": containers, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
        {"containers": containers, "volumes": [{"name": "t", "image": {"reference": "python:3.11"}}]},
        {"containers": containers, "volumes": [{"name": "t", "image": {"reference": "registry.k8s.io/pause:3.9"}}]},
        {"containers": containers, "nodeName": "cpu-2"},
        {"initContainers": containers, "containers": [{"name": "b", "image": "python:3.11"}]},
        {"containers": [{"name": "agent", "image": SWE, "imagePullPolicy": "Always"}]},
    ]


def _cluster():
    return inv(node("cpu-1", SWE, "python:3.11", labels={"pool": "cpu"}),
               node("cpu-2", SWE, labels={"pool": "cpu"}, expires_at=NOW + 60),
               node("gpu-1", "python:3.11", labels={"pool": "gpu"}, taints=[Taint("gpu", "", "NoSchedule")]))


@pytest.mark.parametrize("kind", ["Pod", "Job", "DaemonSet"])
def test_a_remembered_decision_equals_a_fresh_one_for_every_spec(kind):
    remembering = _cluster()
    for spec in _specs() * 2:  # the second round comes from memory
        assert decide(spec, remembering, now=NOW, kind=kind) == decide(spec, _cluster(), now=NOW, kind=kind), spec
    assert len(remembering.decisions) == len(_specs())


def test_a_remembered_decision_ends_when_a_lease_ends_and_before_the_one_it_saw():
    cluster = _cluster()
    spec = {"containers": [{"name": "agent", "image": "python:3.11", "imagePullPolicy": "IfNotPresent"}]}
    before = decide(spec, cluster, now=NOW)  # cpu-2's lease runs: it lacks "python:3.11"
    after = decide(spec, cluster, now=NOW + 61)  # lease over: cpu-2 proves nothing
    assert (before.outcome, after.outcome) == (Outcome.DENY, Outcome.UNKNOWN)
    assert decide(spec, cluster, now=NOW + 30) == before and decide(spec, cluster, now=NOW + 90) == after


def test_specs_that_cannot_be_keyed_are_decided_every_time():
    cluster = _cluster()
    odd = [{"containers": ({"name": "a", "image": SWE},)},  # a tuple, not JSON's list
           {"containers": [{"name": "a", "image": SWE}], "nodeSelector": {"pool": float("nan")}},
           {"containers": [{"name": "a", "image": "x" * 5000 + ":1"}]}]
    for spec in odd:
        try:
            decide(spec, cluster, now=NOW)
        except (WorkloadError, SchedulingSpecError):
            pass
    assert cluster.decisions == {}
