"""Steering (core/admission/steering.py, core/admission/mutation.py) and the rule it makes true (REQUIRE_ONE_NODE).

The patch's shape follows the apiserver's validation: one value per node field selector
(pkg/apis/core/validation/validation.go, ValidateNodeFieldSelectorRequirement). That the apiserver
accepts the patched Pod and the scheduler binds it only to holders is proved on the real control
plane in tests/cluster/test_cluster_steering.py."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path

import pytest

from image_preflight.core.admission import steering
from image_preflight.core.admission.answers import ReviewDecision
from image_preflight.core.admission.mutation import steer
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.decision import REQUIRE_ALL, REQUIRE_ANY, REQUIRE_ONE_NODE, Outcome, decide
from image_preflight.core.decide.scheduling import Taint
from tests.builders.inventories import inv, node, pod

IMAGE = "swe/task:openai"
OTHER = "swe/other:openai"
HELD = ("docker.io/" + IMAGE,)
DEPLOY_DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def three(*holders: str, unknown: str = "") -> object:
    """Three untainted nodes a, b, c; `holders` hold IMAGE; `unknown` has a capped list without it."""
    return inv(*(node(n, *(HELD if n in holders else ()), complete=n != unknown) for n in "abc"))


def plan_for(spec: dict, inventory, **options) -> steering.Plan:
    return steering.plan(decide(spec, inventory, require=REQUIRE_ALL), **options)


# --- whom to steer to ----------------------------------------------------------------------------


@pytest.mark.parametrize("holders,expected", [("a", ("a",)), ("ab", ("a", "b"))])
def test_a_pod_is_steered_to_the_eligible_nodes_that_hold_its_images(holders, expected):
    assert plan_for(pod(IMAGE), three(*holders)) == steering.Plan(expected)


@pytest.mark.parametrize("inventory,reason", [
    (three("a", "b", "c"), steering.ALL_HOLD),
    (three(), steering.NONE_HOLD),
    (three("a", unknown="b"), steering.INCOMPLETE),  # b may hold it: never ruled out on a guess
    (inv(), steering.NO_ELIGIBLE),
])
def test_not_steered_when_all_hold_none_holds_or_a_list_is_incomplete(inventory, reason):
    assert plan_for(pod(IMAGE), inventory) == steering.Plan(reason=reason)


def test_an_invalid_image_is_left_to_the_validating_webhook():
    assert plan_for(pod("not a reference:x"), three("a")).reason == steering.INVALID_IMAGE


def test_only_eligible_nodes_count():
    # c holds it but is tainted: steering to c would only make the pod unschedulable.
    taint = Taint("gpu", "true", "NoSchedule")
    inventory = inv(node("a"), node("b", *HELD), node("c", *HELD, taints=[taint]))
    assert plan_for(pod(IMAGE), inventory).nodes == ("b",)


def test_a_pod_is_steered_to_the_nodes_holding_every_image():
    inventory = inv(node("a", "docker.io/" + IMAGE), node("b", "docker.io/" + IMAGE, "docker.io/" + OTHER),
                    node("c", "docker.io/" + OTHER))
    assert plan_for(pod(IMAGE, OTHER), inventory).nodes == ("b",)


def test_more_nodes_than_the_bound_are_not_written():
    inventory = inv(*(node(f"n{i}", *HELD) for i in range(5)), node("lacking"))
    assert plan_for(pod(IMAGE), inventory, max_nodes=5).nodes == tuple(f"n{i}" for i in range(5))
    assert plan_for(pod(IMAGE), inventory, max_nodes=4).reason == steering.TOO_MANY
    assert plan_for(pod(IMAGE), inventory, max_nodes=9, terms=2).reason == steering.TOO_MANY  # 5 nodes x 2 terms


@pytest.mark.parametrize("change,reason", [
    ({"spec": {"nodeName": "a"}}, steering.NODE_NAME),
    ({"spec": {"schedulingGates": [{"name": "kueue"}]}}, steering.GATED),
    ({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u",
                                        "controller": True}]}}, steering.DAEMON_SET),
])
def test_pods_placed_otherwise_are_never_steered(change, reason):
    assert steering.not_steerable({"metadata": {}, "spec": {}, **change}) == reason
    job_owned = {"metadata": {"ownerReferences": [{"kind": "Job", "controller": True}]}, "spec": {}}
    assert steering.not_steerable(job_owned) is None


# --- the patch -----------------------------------------------------------------------------------


def apply(document: dict, operations: list[dict]) -> dict:
    """RFC 6902 `add`, the only operation the patch uses (the apiserver applies it with
    evanphx/json-patch; tests/cluster/test_cluster_steering.py proves the real thing)."""
    result = copy.deepcopy(document)
    for operation in operations:
        assert operation["op"] == "add"
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        target = result
        for key in parents:
            target = target[key]
        target[last] = operation["value"]
    return result


def full_pod(**spec) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": pod(IMAGE, **spec)}


def terms_of(document: dict) -> list:
    return document["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]


def steered(original: dict, inventory=None, holders: str = "ab", labels=None) -> list[dict]:
    """The JSONPatch POST /mutate answers for the Pod `original`: steered to `holders` (which hold
    its image; one more eligible node lacks it) unless `inventory` is given."""
    if inventory is None:
        inventory = inv(*(node(n, *HELD, labels=labels) for n in holders), node("lacking", labels=labels))
    response = steer(review(original), inventory, Settings(steer=True)).review["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def test_a_pod_without_affinity_gets_one_term_per_node_and_the_annotation():
    patched = apply(full_pod(), steered(full_pod()))
    assert terms_of(patched) == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
                                 for n in ("a", "b")]
    assert patched["metadata"]["annotations"] == {steering.STEERED_TO: "2 nodes"}
    assert patched["spec"]["containers"] == full_pod()["spec"]["containers"]  # nothing else changes


def test_the_requirement_is_anded_into_every_existing_term():
    zone = {"key": "zone", "operator": "In", "values": ["z1", "z2"]}
    pinned_a = {"key": "metadata.name", "operator": "In", "values": ["a"]}
    existing = [{"matchExpressions": [zone]}, {"matchFields": [pinned_a]}, {}]
    original = full_pod(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": existing},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [zone]}}]},
        "podAntiAffinity": {"x": 1}})
    original["metadata"]["annotations"] = {"keep": "me"}
    patched = apply(original, steered(original, labels={"zone": "z1"}))

    def pin(name):
        return {"key": "metadata.name", "operator": "In", "values": [name]}
    # (zone or name=a or <empty>) and (a or b): the empty term matches nothing, name=a and b nothing.
    assert terms_of(patched) == [{"matchExpressions": [zone], "matchFields": [pin("a")]},
                                 {"matchExpressions": [zone], "matchFields": [pin("b")]},
                                 {"matchFields": [pinned_a]}]
    assert patched["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    assert patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
        original["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert patched["metadata"]["annotations"] == {"keep": "me", steering.STEERED_TO: "2 nodes"}


def test_every_node_field_selector_has_one_value_as_the_apiserver_requires():
    patched = apply(full_pod(), steered(full_pod(), holders="abcdef"))
    assert len(terms_of(patched)) == 6
    for term in terms_of(patched):
        assert all(len(r["values"]) == 1 and r["operator"] == "In" for r in term["matchFields"])


@pytest.mark.parametrize("holders", ["a", "ab"])
def test_a_steered_pod_is_decided_allowed_and_steering_it_again_changes_nothing(holders):
    inventory = three(*holders)
    original = full_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/os", "operator": "NotIn",
                                                      "values": ["windows"]}]}]}}})
    patched = apply(original, steered(original, inventory))
    after = decide(patched["spec"], inventory, require=REQUIRE_ALL)
    assert after.outcome == Outcome.ALLOW and after.eligible == tuple(holders)
    assert plan_for(patched["spec"], inventory).reason == steering.ALL_HOLD  # reinvocation: no patch


# --- POST /mutate's answer ------------------------------------------------------------------------


def review(obj: dict, *, operation: str = "CREATE", kind: str = "Pod") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "kind": {"group": "" if kind == "Pod" else "batch", "version": "v1", "kind": kind},
        "operation": operation, "namespace": "ns", "object": obj}}


def test_mutate_answers_with_a_json_patch_and_always_allows():
    outcome = steer(review(full_pod()), three("a"), Settings(steer=True))
    response = outcome.review["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert terms_of(apply(full_pod(), json.loads(base64.b64decode(response["patch"])))) == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]
    assert (outcome.decision, outcome.detail) == (ReviewDecision.STEERED, "1 nodes: a")


@pytest.mark.parametrize("request_,inventory,reason", [
    (review(full_pod()), three("a", "b", "c"), steering.ALL_HOLD),
    (review(full_pod()), three(), steering.NONE_HOLD),
    (review(full_pod(nodeName="b")), three("a"), steering.NODE_NAME),
])
def test_mutate_says_why_it_did_not_steer(request_, inventory, reason):
    outcome = steer(request_, inventory, Settings(steer=True))
    assert "patch" not in outcome.review["response"] and outcome.review["response"]["allowed"] is True
    assert (outcome.decision, outcome.detail) == (ReviewDecision.NOT_STEERED, reason)


@pytest.mark.parametrize("request_", [review(full_pod(), operation="UPDATE"),
                                      review({"kind": "Job", "spec": {}}, kind="Job")])
def test_mutate_leaves_anything_but_a_pod_create_alone(request_):
    outcome = steer(request_, three("a"), Settings(steer=True))
    assert outcome.decision == "skip" and "patch" not in outcome.review["response"]


def test_mutate_and_validate_share_one_scope_check():
    """scope.in_scope: a Pod of another API group or a subresource is left alone by both; a gated Pod
    at CREATE is left by /validate for the UPDATE that releases it, and answered by /mutate, which
    says why it does not steer it."""
    foreign = review(full_pod())
    foreign["request"]["kind"]["group"] = "example.com"
    status = review(full_pod())
    status["request"]["subResource"] = "status"
    for request_ in (foreign, status):
        assert steer(request_, three("a"), Settings(steer=True)).decision == "skip"
        assert admit(request_, three("a"), Settings(steer=True)).decision == "skip"
    gated = review(full_pod(schedulingGates=[{"name": "kueue.x-k8s.io/admission"}]))
    assert admit(gated, three("a"), Settings(steer=True)).decision == "skip"
    outcome = steer(gated, three("a"), Settings(steer=True))
    assert (outcome.decision, outcome.detail) == (ReviewDecision.NOT_STEERED, steering.GATED)


def test_mutate_answers_an_unreadable_pod_without_a_patch():
    broken = full_pod()
    broken["spec"]["containers"] = "x"
    outcome = steer(review(broken), three("a"), Settings(steer=True))
    assert outcome.decision == "unreadable" and outcome.review["response"]["allowed"] is True


# --- the rule steering makes true: one eligible node holds every image ----------------------------


@pytest.mark.parametrize("inventory,outcomes", [
    # (all, any, one-node)
    (three("a"), (Outcome.DENY, Outcome.ALLOW, Outcome.ALLOW)),
    (three(), (Outcome.DENY, Outcome.DENY, Outcome.DENY)),
    (three("a", "b", "c"), (Outcome.ALLOW, Outcome.ALLOW, Outcome.ALLOW)),
    (three(unknown="b"), (Outcome.DENY, Outcome.UNKNOWN, Outcome.DENY)),
    # a holds it, c lacks it, b's list is capped: the Pods are not steered (a guess is never a
    # restriction), so they are denied as under "all", and the Job with them.
    (three("a", unknown="b"), (Outcome.DENY, Outcome.ALLOW, Outcome.DENY)),
    (three("a", "c", unknown="b"), (Outcome.UNKNOWN, Outcome.ALLOW, Outcome.UNKNOWN)),
])
def test_one_node_admits_what_steering_can_place(inventory, outcomes):
    assert tuple(decide(pod(IMAGE), inventory, require=r).outcome
                 for r in (REQUIRE_ALL, REQUIRE_ANY, REQUIRE_ONE_NODE)) == outcomes


def test_one_node_needs_every_image_on_the_same_node_where_any_does_not():
    inventory = inv(node("a", "docker.io/" + IMAGE), node("b", "docker.io/" + OTHER))
    assert decide(pod(IMAGE, OTHER), inventory, require=REQUIRE_ANY).outcome == Outcome.ALLOW
    denied = decide(pod(IMAGE, OTHER), inventory, require=REQUIRE_ONE_NODE)
    assert denied.outcome == Outcome.DENY and {v.missing_on for v in denied.verdicts} == {("b",), ("a",)}


def test_with_steering_jobs_are_decided_by_one_node_and_pods_as_configured():
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
           "spec": {"template": {"spec": pod(IMAGE)}}}
    settings = Settings(steer=True)
    assert admit(review(job, kind="Job"), three("a"), settings).review["response"]["allowed"] is True
    assert admit(review(job, kind="Job"), three("a"), Settings()).review["response"]["allowed"] is False
    assert admit(review(full_pod()), three("a"), settings).review["response"]["allowed"] is False
    assert admit(review(job, kind="Job"), three(), settings).review["response"]["allowed"] is False


def test_the_deploy_guide_explains_every_reason_a_pod_is_not_steered_and_no_other():
    text = DEPLOY_DOC.read_text()
    table = text[text.index("Not steered, with the reason"):]
    table = table[:table.index("\n\n", table.index("| reason |"))]
    documented = {name for line in table.splitlines()[3:] for name in re.findall(r"`([a-z-]+)`", line.split("|")[1])}
    assert documented == {reason.value for reason in steering.NotSteered}

