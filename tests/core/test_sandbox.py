"""A node whose runtime lacks its sandbox (pause) image starts no pod (core/decide/decision.py,
decide_images): the decision, its words (core/admission/messages.py), steering (core/admission/steering.py) and
the scanner; tests/cluster/test_cluster_sandbox.py has the watchdog failing a Job whose Pod the kubelet
reports so, on the real control plane.

The kubelet creates a Pod's sandbox before it looks at any of its images
(pkg/kubelet/kuberuntime/kuberuntime_manager.go, SyncPod), and containerd fails RunPodSandbox
without its sandbox image (internal/cri/server/podsandbox/sandbox_run.go): so whatever a Pod's
images and pull policies, it waits in ContainerCreating there."""

from __future__ import annotations

import pytest

from image_preflight.core.admission import messages, steering
from image_preflight.core.decide import words
from image_preflight.core.decide.decision import (
    MISSING,
    NOT_CHECKED,
    PRESENT,
    REQUIRE_ALL,
    REQUIRE_ANY,
    REQUIRE_ONE_NODE,
    Outcome,
    decide,
)
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.decide.scheduling import Taint
from tests.builders.inventories import node, pod

NOW = 1_796_000_000.0
PAUSE = "registry.k8s.io/pause:3.10.1"
IMAGE = "swe/task:openai"
HELD = ("docker.io/" + IMAGE,)
GPU = Taint("nvidia.com/gpu", "present", "NoSchedule")


# As the node agent lists a node: complete, leased, from the runtime.
LEASED = {"observed_at": NOW, "expires_at": NOW + 300, "source": "cri"}


def cluster(*nodes: NodeImages) -> Inventory:
    return Inventory(tuple(nodes))


def statuses(decision) -> list[str]:
    return [v.status for v in decision.verdicts]


# --- the decision ---------------------------------------------------------------------------------


def test_a_node_without_its_sandbox_image_lacks_every_image_even_those_it_holds():
    decision = decide(pod(IMAGE), cluster(node("a", *HELD, **LEASED),
                                          node("b", *HELD, sandbox_missing=PAUSE, **LEASED)), now=NOW)
    assert decision.outcome == Outcome.DENY
    assert statuses(decision) == [MISSING] and decision.verdicts[0].missing_on == ("b",)
    assert decision.sandbox_missing == (("b", PAUSE),)
    assert decision.runnable == ("a",)
    assert not decision.images(MISSING)  # b lacks it only for want of a sandbox


def test_the_missing_images_name_only_the_nodes_that_start_pods():
    """Decision.images(MISSING), which the denial, the warnings and the scanner's row all read."""
    decision = decide(pod(IMAGE, "swe/other:openai"),
                      cluster(node("a", *HELD, **LEASED), node("b", sandbox_missing=PAUSE, **LEASED),
                              node("c", **LEASED)), now=NOW)
    assert decision.halted == ("b",)
    missing = decision.images(MISSING)
    assert [(v.image.image, nodes) for v, nodes in missing] == [(IMAGE, ("c",)), ("swe/other:openai", ("a", "c"))]
    assert (missing.images, missing.nodes) == ((IMAGE, "swe/other:openai"), ("c", "a"))
    assert decision.images(MISSING) is missing  # made once per decision, which memory.py keeps


@pytest.mark.parametrize("policy", ["Always", "Never", "IfNotPresent"])
def test_under_require_all_a_pod_that_may_land_there_is_denied_whatever_its_pull_policy(policy):
    decision = decide(pod(IMAGE, policy=policy),
                      cluster(node("a", *HELD, **LEASED), node("b", *HELD, sandbox_missing=PAUSE, **LEASED)), now=NOW)
    assert decision.outcome == Outcome.DENY
    # Always images stay unchecked (a pull gets them): the node, not the image, is what fails.
    assert statuses(decision) == [NOT_CHECKED if policy == "Always" else MISSING]


def test_under_require_any_some_node_that_can_start_the_pod_is_enough_and_none_is_a_denial():
    always = pod(IMAGE, policy="Always")
    mixed = cluster(node("a", **LEASED), node("b", sandbox_missing=PAUSE, **LEASED))
    assert decide(always, mixed, require=REQUIRE_ANY, now=NOW).outcome == Outcome.ALLOW
    stranded = cluster(node("a", sandbox_missing=PAUSE, **LEASED), node("b", sandbox_missing=PAUSE, **LEASED))
    assert decide(always, stranded, require=REQUIRE_ANY, now=NOW).outcome == Outcome.DENY
    # An image held only where no pod starts is held nowhere useful.
    only_there = decide(pod(IMAGE), cluster(node("a", **LEASED), node("b", *HELD, sandbox_missing=PAUSE, **LEASED)),
                        require=REQUIRE_ANY, now=NOW)
    assert only_there.outcome == Outcome.DENY and statuses(only_there) == [MISSING]


def test_under_one_node_a_template_is_allowed_when_a_node_that_starts_pods_holds_its_images():
    inventory = cluster(node("a", *HELD, **LEASED), node("b", *HELD, sandbox_missing=PAUSE, **LEASED))
    decision = decide(pod(IMAGE), inventory, require=REQUIRE_ONE_NODE, now=NOW)
    assert decision.outcome == Outcome.ALLOW and statuses(decision) == [PRESENT]
    held_only_there = cluster(node("a", **LEASED), node("b", *HELD, sandbox_missing=PAUSE, **LEASED))
    assert decide(pod(IMAGE), held_only_there, require=REQUIRE_ONE_NODE, now=NOW).outcome == Outcome.DENY


def test_a_stale_report_proves_nothing_and_the_remembered_decision_ends_with_its_lease():
    inventory = cluster(node("a", *HELD, **LEASED),
                        node("b", *HELD, sandbox_missing=PAUSE, expires_at=NOW + 60, observed_at=NOW, source="cri"))
    before = decide(pod(IMAGE), inventory, now=NOW)
    after = decide(pod(IMAGE), inventory, now=NOW + 60)
    assert (before.outcome, after.outcome) == (Outcome.DENY, Outcome.ALLOW)
    assert after.sandbox_missing == ()
    assert decide(pod(IMAGE), inventory, now=NOW + 30) == before  # from memory, within the same window


def test_a_remembered_decision_equals_a_fresh_one():
    specs = [pod(IMAGE), pod(IMAGE, policy="Always"), pod(IMAGE, nodeName="a"), pod(IMAGE, nodeName="b")]

    def inventory():
        return cluster(node("a", *HELD, **LEASED), node("b", *HELD, sandbox_missing=PAUSE, **LEASED))

    remembering = inventory()
    for spec in specs * 2:
        assert decide(spec, remembering, now=NOW) == decide(spec, inventory(), now=NOW), spec


def test_only_eligible_nodes_count():
    inventory = cluster(node("a", *HELD, **LEASED), node("gpu", sandbox_missing=PAUSE, taints=[GPU], **LEASED))
    assert decide(pod(IMAGE), inventory, now=NOW).outcome == Outcome.ALLOW
    assert decide(pod(IMAGE, nodeName="a"), inventory, now=NOW).outcome == Outcome.ALLOW
    assert decide(pod(IMAGE, nodeName="gpu"), inventory, now=NOW).sandbox_missing == (("gpu", PAUSE),)


def test_a_node_that_holds_its_sandbox_image_is_unaffected():
    assert decide(pod(IMAGE), cluster(node("a", *HELD, **LEASED)), now=NOW).sandbox_missing == ()


# --- the words ------------------------------------------------------------------------------------


def test_the_denial_names_the_node_and_its_sandbox_image_once_and_the_fix():
    decision = decide(pod(IMAGE), cluster(node("a", *HELD, **LEASED),
                                          node("b", *HELD, sandbox_missing=PAUSE, **LEASED)), now=NOW)
    assert messages.denial_message(decision) == (
        "invalid: eligible node(s) b cannot start any pod: the container runtime lacks its sandbox image "
        "'registry.k8s.io/pause:3.10.1', so the pod would wait in ContainerCreating (FailedCreatePodSandBox); "
        "import it: ctr -n k8s.io images import pause.tar")


def test_a_missing_image_elsewhere_is_named_beside_it_without_the_node_that_starts_nothing():
    decision = decide(pod(IMAGE), cluster(node("a", **LEASED), node("b", *HELD, sandbox_missing=PAUSE, **LEASED),
                                          node("c", sandbox_missing=PAUSE, **LEASED)),
                      now=NOW)
    message = messages.denial_message(decision)
    assert message.startswith("invalid: eligible node(s) b, c cannot start any pod: ")
    assert f"; image '{IMAGE}' (container 'c0', imagePullPolicy IfNotPresent) is absent from eligible node(s) a;" \
        in message
    assert message.endswith(messages.ADVICE)


def test_warn_mode_warnings_name_the_node_and_image():
    decision = decide(pod(IMAGE), cluster(node("a", *HELD, **LEASED),
                                          node("b", *HELD, sandbox_missing=PAUSE, **LEASED)), now=NOW)
    assert messages.missing_warnings(decision) == [
        f"image-preflight: node(s) b cannot start any pod: the runtime lacks its sandbox image {PAUSE}"]


def test_many_nodes_stay_within_the_limit():
    nodes = [node(f"cpu-{n:03d}", sandbox_missing=PAUSE, **LEASED) for n in range(300)]
    message = messages.denial_message(decide(pod(IMAGE, policy="Always"), cluster(*nodes), now=NOW))
    assert len(message.encode()) <= messages.MAX_MESSAGE
    assert "cpu-004 and 295 more cannot start any pod" in message and message.endswith(words.SANDBOX_ADVICE)


# --- steering -------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["IfNotPresent", "Always"])
def test_a_pod_is_steered_off_nodes_that_start_no_pod_whatever_its_images(policy):
    inventory = cluster(node("a", *HELD, **LEASED), node("b", *HELD, sandbox_missing=PAUSE, **LEASED),
                        node("c", *HELD, **LEASED))
    plan = steering.plan(decide(pod(IMAGE, policy=policy), inventory, require=REQUIRE_ALL, now=NOW))
    assert plan == steering.Plan(("a", "c"))


def test_no_node_that_starts_pods_means_no_steering():
    inventory = cluster(node("a", sandbox_missing=PAUSE, **LEASED), node("b", sandbox_missing=PAUSE, **LEASED))
    plan = steering.plan(decide(pod(IMAGE, policy="Always"), inventory, require=REQUIRE_ALL, now=NOW))
    assert plan == steering.Plan(reason=steering.NONE_HOLD)


# --- the scanner ------------------------------------------------------------------------------------


def test_the_scanner_drops_rows_for_a_node_without_its_sandbox_image_under_their_own_reason():
    """core/rows/judge.py verdict_of: the row is dropped, naming the node and its sandbox image, and
    no image the node holds goes to the build list (--missing-images)."""
    from image_preflight.core.rows.judge import MISSING_IMAGE, NO_SANDBOX, verdict_of

    one = cluster(node("cpu-1", *HELD, sandbox_missing=PAUSE, **LEASED))
    halted = verdict_of(decide(pod(IMAGE), one, now=NOW), one, now=NOW)
    assert (halted.reason, halted.images, halted.nodes) == (NO_SANDBOX, (), ("cpu-1",))
    assert PAUSE in halted.detail and "ctr -n k8s.io images import" in halted.detail
    # Beside a node that truly lacks the image, only that node is named for it.
    two = cluster(node("cpu-1", *HELD, sandbox_missing=PAUSE, **LEASED), node("cpu-2", **LEASED))
    both = verdict_of(decide(pod(IMAGE), two, now=NOW), two, now=NOW)
    assert (both.reason, both.nodes) == (MISSING_IMAGE, ("cpu-2",))
