"""image_preflight.core.admission.review: AdmissionReviews shaped as the apiserver sends them, decided without I/O."""

from __future__ import annotations

import copy
import json

import pytest

from image_preflight.core.admission import messages
from image_preflight.core.admission.answers import API_VERSION
from image_preflight.core.admission.body import BadReview, parse_review
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import AUDIT, ENFORCE, WARN, Settings
from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.decide.scheduling import NodeTraits, Taint
from tests.agent_lightning import fails_at_once
from tests.builders.inventories import NOW, node
from tests.builders.reviews import ABSENT, HELD, RESOURCES, pod_spec, review, workload

WEBHOOK_NAME = "image-preflight.image-preflight.io"
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")

WORKLOADS = [k for k in RESOURCES if k != "ConfigMap"]


def apiserver_error(message: str) -> str:
    """The error text the Job's creator receives for a denial."""
    return f'admission webhook "{WEBHOOK_NAME}" denied the request: {message}'


CPU, GPU = {"pool": "cpu"}, {"pool": "gpu"}
# cpu-1 holds HELD, cpu-2 too; gpu-1 is tainted and holds nothing.
INVENTORY = Inventory((
    node("cpu-1", HELD, "registry.k8s.io/pause:3.9", labels=CPU),
    node("cpu-2", HELD, labels=CPU),
    node("gpu-1", taints=(GPU_TAINT,), labels=GPU),
))


def decide(rv: dict, inventory: Inventory = INVENTORY, **settings):
    return admit(parse_review(json.dumps(rv).encode()), inventory, Settings(**settings), now=NOW)


def response(outcome) -> dict:
    return outcome.review["response"]


def assert_envelope(outcome, rv: dict) -> None:
    assert outcome.review["apiVersion"] == rv["apiVersion"]
    assert outcome.review["kind"] == rv["kind"]
    assert response(outcome)["uid"] == rv["request"]["uid"]


def assert_untouched(outcome) -> None:
    assert response(outcome) == {"uid": outcome.uid, "allowed": True}
    assert outcome.decision == "skip"


def assert_warnings_within_limits(warnings: list[str]) -> None:
    assert all(len(w) <= messages.MAX_WARNING for w in warnings), [w for w in warnings if len(w) > 120]
    assert sum(len(w.encode()) for w in warnings) <= messages.MAX_WARNINGS_TOTAL
    assert not any(w.lower().startswith("warning:") for w in warnings)
    assert len(set(warnings)) == len(warnings)


# --- what is decided -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", WORKLOADS)
def test_every_workload_kind_is_denied_on_create_when_an_image_is_absent(kind):
    rv = review(workload(kind, pod_spec(ABSENT)))
    outcome = decide(rv)

    assert_envelope(outcome, rv)
    reply = response(outcome)
    assert reply["allowed"] is False
    assert reply["status"]["code"] == 422
    assert reply["status"]["reason"] == "Invalid"
    message = reply["status"]["message"]
    assert ABSENT in message and "'rollout'" in message and "IfNotPresent" in message
    # Both untainted nodes lack it; the tainted gpu node is not eligible, so it is not named.
    assert "cpu-1" in message and "cpu-2" in message and "gpu-1" not in message
    assert messages.ADVICE in message
    assert outcome.decision == "deny" and outcome.images == [ABSENT]
    assert outcome.kind == kind and outcome.namespace == "agl" and outcome.operation == "CREATE"


@pytest.mark.parametrize("kind", WORKLOADS)
def test_every_workload_kind_is_allowed_when_every_eligible_node_holds_the_image(kind):
    rv = review(workload(kind, pod_spec(HELD)))
    outcome = decide(rv)

    assert_envelope(outcome, rv)
    assert response(outcome) == {"uid": rv["request"]["uid"], "allowed": True}
    assert outcome.decision == "allow"


def test_only_eligible_nodes_lacking_the_image_are_named():
    inventory = Inventory((node("cpu-1", ABSENT, labels=CPU), node("cpu-2", labels=CPU), node("gpu-1", labels=GPU)))
    spec = pod_spec(ABSENT, nodeSelector={"pool": "cpu"})
    message = response(decide(review(workload("Job", spec)), inventory))["status"]["message"]
    assert "cpu-2" in message
    assert "cpu-1" not in message and "gpu-1" not in message


def test_a_pod_bound_to_a_node_is_judged_on_that_node_alone():
    inventory = Inventory((node("cpu-1", ABSENT, labels=CPU), node("cpu-2", labels=CPU)))
    allowed = decide(review(workload("Pod", pod_spec(ABSENT, nodeName="cpu-1"))), inventory)
    denied = decide(review(workload("Pod", pod_spec(ABSENT, nodeName="cpu-2"))), inventory)
    assert response(allowed)["allowed"] is True
    assert response(denied)["allowed"] is False


def test_the_reply_carries_the_request_uid_and_envelope_unchanged():
    uid = "0df28fbd-5f5f-11e8-bc74-36e6bb280816"
    rv = review(workload("Job", pod_spec(ABSENT)), uid=uid)
    outcome = decide(rv)
    assert outcome.review["apiVersion"] == "admission.k8s.io/v1"
    assert outcome.review["kind"] == "AdmissionReview"
    assert response(outcome)["uid"] == uid
    assert set(outcome.review) == {"apiVersion", "kind", "response"}


def test_dry_run_is_decided_as_a_real_request():
    obj = workload("Job", pod_spec(ABSENT))
    real, dry = decide(review(obj)), decide(review(obj, dry_run=True))
    assert response(dry) == response(real)
    assert response(dry)["allowed"] is False


def test_a_generated_name_is_logged_when_the_name_is_not_yet_set():
    obj = workload("Job", pod_spec(ABSENT))
    obj["metadata"] = {"generateName": "rollout-", "namespace": "agl"}
    outcome = decide(review(obj))
    assert outcome.name == "rollout-"
    assert outcome.log_record()["name"] == "rollout-"


# --- what passes untouched -----------------------------------------------------------------------


def test_other_kinds_pass_untouched():
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "agl"},
                 "data": {"image": ABSENT}}
    assert_untouched(decide(review(configmap)))


def test_a_same_named_kind_of_another_api_group_passes_untouched():
    obj = workload("Job", pod_spec(ABSENT))
    obj["apiVersion"] = "example.com/v1"
    assert_untouched(decide(review(obj, group="example.com")))


@pytest.mark.parametrize("kind", ["Job", "Pod", "CronJob"])
def test_delete_passes_untouched(kind):
    assert_untouched(decide(review(None, operation="DELETE", old=workload(kind, pod_spec(ABSENT)))))


def test_connect_passes_untouched():
    exec_options = {"apiVersion": "v1", "kind": "PodExecOptions", "stdin": True, "tty": True,
                    "container": "rollout", "command": ["bash"]}
    rv = review(exec_options, operation="CONNECT", kind="Pod", sub_resource="exec")
    rv["request"]["name"], rv["request"]["namespace"] = "rollout-7f3a", "agl"
    outcome = decide(rv)
    assert_envelope(outcome, rv)
    assert_untouched(outcome)


def test_a_status_subresource_update_passes_untouched():
    old = workload("Pod", pod_spec(ABSENT))
    new = copy.deepcopy(old)
    new["status"] = {"phase": "Pending"}
    new["spec"]["nodeSelector"] = {"pool": "cpu"}  # not possible through /status, but proves the skip
    assert_untouched(decide(review(new, operation="UPDATE", old=old, sub_resource="status")))


def test_an_update_that_changes_neither_images_nor_scheduling_passes_untouched():
    old = workload("Job", pod_spec(ABSENT))
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "rollouts"
    new["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    new["status"] = {"active": 1}
    assert_untouched(decide(review(new, operation="UPDATE", old=old)))


# --- UPDATE --------------------------------------------------------------------------------------


def test_kueue_unsuspending_a_job_and_setting_its_node_selector_is_decided():
    inventory = Inventory((node("cpu-1", ABSENT, labels=CPU), node("cpu-2", ABSENT, labels=CPU),
                           node("big-1", labels={"pool": "big"})))
    old = workload("Job", pod_spec(ABSENT))
    old["spec"]["suspend"] = True
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = False
    new["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "big"}

    outcome = decide(review(new, operation="UPDATE", old=old), inventory)

    assert response(outcome)["allowed"] is False
    assert "big-1" in response(outcome)["status"]["message"]
    assert outcome.operation == "UPDATE"


def test_a_suspended_job_is_not_placed_yet_and_is_decided_when_unsuspended():
    """pkg/controller/job/job_controller.go, syncJob: a suspended Job creates no pods. Kueue creates
    Jobs suspended and unsuspends them later; only then are its pods placed."""
    suspended = workload("Job", pod_spec(ABSENT))
    suspended["spec"]["suspend"] = True
    assert_untouched(decide(review(suspended)))
    still = copy.deepcopy(suspended)
    still["spec"]["template"]["metadata"]["labels"]["queue"] = "a"
    assert_untouched(decide(review(still, operation="UPDATE", old=suspended)))
    released = copy.deepcopy(suspended)
    released["spec"]["suspend"] = False  # nothing else changes: decided all the same
    assert response(decide(review(released, operation="UPDATE", old=suspended)))["allowed"] is False


def test_a_gated_pod_is_not_placed_yet_and_is_decided_when_its_last_gate_goes():
    """pkg/scheduler/framework/plugins/schedulinggates: a Pod with schedulingGates is not scheduled."""
    gated = workload("Pod", pod_spec(ABSENT, schedulingGates=[{"name": "kueue.x-k8s.io/admission"},
                                                               {"name": "example.com/quota"}]))
    assert_untouched(decide(review(gated)))
    one_left = copy.deepcopy(gated)
    one_left["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    assert_untouched(decide(review(one_left, operation="UPDATE", old=gated)))
    ungated = copy.deepcopy(gated)
    ungated["spec"]["schedulingGates"] = []
    assert response(decide(review(ungated, operation="UPDATE", old=one_left)))["allowed"] is False


def test_an_update_to_the_image_is_decided():
    old = workload("Deployment", pod_spec(HELD))
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["image"] = ABSENT
    assert response(decide(review(new, operation="UPDATE", old=old)))["allowed"] is False


def test_an_update_to_the_pull_policy_is_decided():
    old = workload("Deployment", pod_spec(ABSENT, policy="Always"))
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    assert response(decide(review(old, operation="UPDATE", old=old)))["allowed"] is True
    assert response(decide(review(new, operation="UPDATE", old=old)))["allowed"] is False


def test_an_update_to_tolerations_is_decided():
    inventory = Inventory((node("cpu-1", ABSENT, labels=CPU), node("gpu-1", taints=(GPU_TAINT,), labels=GPU)))
    old = workload("Job", pod_spec(ABSENT))
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert response(decide(review(old, operation="UPDATE", old=old), inventory))["allowed"] is True
    denied = decide(review(new, operation="UPDATE", old=old), inventory)
    assert response(denied)["allowed"] is False
    assert "gpu-1" in response(denied)["status"]["message"]


def test_an_update_of_an_unchanged_workload_that_was_already_denied_is_not_blocked():
    # Labels, finalizers and status of a Job created before the webhook must still be writable.
    old = workload("CronJob", pod_spec(ABSENT))
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = True
    assert_untouched(decide(review(new, operation="UPDATE", old=old)))


# --- modes and the unknown policy ------------------------------------------------------------------


def test_warn_mode_allows_and_names_the_missing_image_and_nodes():
    outcome = decide(review(workload("Job", pod_spec(ABSENT))), mode=WARN)
    reply = response(outcome)
    assert reply["allowed"] is True and "status" not in reply
    assert any(ABSENT in w and "cpu-1" in w and "cpu-2" in w for w in reply["warnings"])
    assert_warnings_within_limits(reply["warnings"])
    assert outcome.decision == "warn"


def test_audit_mode_allows_without_a_word_to_the_client_but_logs_what_enforce_would_deny():
    outcome = decide(review(workload("Job", pod_spec(ABSENT))), mode=AUDIT)
    reply = response(outcome)
    assert reply == {"uid": outcome.uid, "allowed": True}
    assert outcome.decision == "audit"
    record = outcome.log_record()
    assert record["decision"] == "audit" and ABSENT in record["detail"]


def test_an_allowed_workload_is_allowed_in_every_mode():
    for mode in (ENFORCE, WARN, AUDIT):
        outcome = decide(review(workload("Job", pod_spec(HELD))), mode=mode)
        assert response(outcome) == {"uid": outcome.uid, "allowed": True}
        assert outcome.decision == "allow"


def test_a_partial_node_list_is_unknown_allowed_with_a_warning_by_default():
    inventory = Inventory((node("cpu-1", ABSENT, labels=CPU), node("cpu-2", HELD, complete=False, labels=CPU)))
    outcome = decide(review(workload("Job", pod_spec(ABSENT))), inventory)
    reply = response(outcome)
    assert reply["allowed"] is True
    [warning] = reply["warnings"]
    assert ABSENT in warning and "cpu-2" in warning and "not confirmed" in warning
    assert outcome.decision == "unknown"


def test_a_stale_runtime_list_is_unknown():
    stale = NodeImages.from_names("cpu-1", [HELD], traits=NodeTraits("cpu-1", {"pool": "cpu"}),
                                  expires_at=NOW - 1, source="cri")
    outcome = decide(review(workload("Job", pod_spec(ABSENT))), Inventory((stale,)))
    assert response(outcome)["allowed"] is True
    assert any("not confirmed on cpu-1" in w for w in response(outcome)["warnings"])


def test_unknown_deny_denies_a_partial_list_with_text_that_fails_the_rollout():
    inventory = Inventory((node("cpu-1", HELD, complete=False, labels=CPU),))
    outcome = decide(review(workload("Job", pod_spec(ABSENT))), inventory, unknown="deny")
    reply = response(outcome)
    assert reply["allowed"] is False and reply["status"]["code"] == 422
    assert fails_at_once(apiserver_error(reply["status"]["message"]))
    assert ABSENT in reply["status"]["message"] and "cpu-1" in reply["status"]["message"]
    assert any("cpu-1" in w for w in reply["warnings"])


def test_no_eligible_node_is_unknown_with_a_warning_and_denied_under_unknown_deny():
    spec = pod_spec(ABSENT, nodeSelector={"pool": "tpu"})
    allowed = response(decide(review(workload("Job", spec))))
    assert allowed["allowed"] is True
    assert any("no node" in w for w in allowed["warnings"])
    denied = response(decide(review(workload("Job", spec)), unknown="deny"))
    assert denied["allowed"] is False
    assert "no node" in denied["status"]["message"]


def test_an_empty_inventory_is_unknown_not_a_denial():
    outcome = decide(review(workload("Job", pod_spec(ABSENT))), Inventory())
    assert response(outcome)["allowed"] is True
    assert response(outcome)["warnings"]


def test_unknown_deny_in_warn_and_audit_modes_still_allows():
    inventory = Inventory((node("cpu-1", complete=False, labels=CPU),))
    for mode, decision in ((WARN, "warn"), (AUDIT, "audit")):
        outcome = decide(review(workload("Job", pod_spec(ABSENT))), inventory, unknown="deny", mode=mode)
        assert response(outcome)["allowed"] is True
        assert outcome.decision == decision


PAUSE = "registry.k8s.io/pause:3.10.1"


def _without_sandbox() -> Inventory:
    """cpu-2's node agent reports that its runtime lacks its sandbox image (spec.sandboxImage)."""
    lacking = NodeImages.from_names("cpu-2", [HELD], traits=NodeTraits("cpu-2", {"pool": "cpu"}), source="cri",
                                    observed_at=NOW, expires_at=NOW + 300, sandbox_missing=PAUSE)
    return Inventory((node("cpu-1", HELD, labels=CPU), lacking))


@pytest.mark.parametrize("policy", ["IfNotPresent", "Always"])
def test_a_node_whose_runtime_lacks_its_sandbox_image_denies_what_may_land_there(policy):
    outcome = decide(review(workload("Job", pod_spec(HELD, policy=policy))), _without_sandbox())
    reply = response(outcome)
    assert reply["allowed"] is False and reply["status"]["code"] == 422 and reply["status"]["reason"] == "Invalid"
    message = reply["status"]["message"]
    assert message.startswith(f"invalid: eligible node(s) cpu-2 cannot start any pod: the container runtime lacks "
                              f"its sandbox image '{PAUSE}'")
    assert "cpu-1" not in message and messages.ADVICE not in message  # no image is missing anywhere
    assert fails_at_once(apiserver_error(message))
    pinned = decide(review(workload("Job", pod_spec(HELD, policy=policy, nodeName="cpu-1"))), _without_sandbox())
    assert response(pinned)["allowed"] is True


def test_a_node_without_its_sandbox_image_is_only_named_in_warn_mode():
    reply = response(decide(review(workload("Job", pod_spec(HELD))), _without_sandbox(), mode=WARN))
    assert reply["allowed"] is True
    assert reply["warnings"] == [f"image-preflight: node(s) cpu-2 cannot start any pod: the runtime lacks its "
                                 f"sandbox image {PAUSE}"]


def test_always_images_are_allowed_with_a_not_checked_warning():
    outcome = decide(review(workload("Job", pod_spec(ABSENT, policy="Always"))))
    reply = response(outcome)
    assert reply["allowed"] is True
    assert reply["warnings"] == [f"image-preflight: {ABSENT} not checked (imagePullPolicy Always pulls it)"]


def test_a_latest_image_without_a_policy_defaults_to_always_and_is_not_checked():
    outcome = decide(review(workload("Pod", pod_spec("python:latest", policy=None))))
    assert response(outcome)["allowed"] is True
    assert "not checked" in response(outcome)["warnings"][0]


def test_never_images_are_checked():
    outcome = decide(review(workload("Pod", pod_spec(ABSENT, policy="Never"))))
    assert response(outcome)["allowed"] is False
    assert "imagePullPolicy Never" in response(outcome)["status"]["message"]


def test_an_invalid_image_reference_is_denied_and_warned_in_warn_mode():
    obj = workload("Job", pod_spec("Swesmith/UPPER:openai"))
    denied = response(decide(review(obj)))
    assert denied["allowed"] is False
    assert "invalid image reference 'Swesmith/UPPER:openai'" in denied["status"]["message"]
    warned = response(decide(review(obj), mode=WARN))
    assert warned["allowed"] is True
    assert any("Swesmith/UPPER:openai" in w for w in warned["warnings"])


# --- objects that cannot be read -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mangle", "field"),
    [
        (lambda o: o["spec"]["template"]["spec"].update(containers={"rollout": {}}), "containers"),
        (lambda o: o["spec"]["template"]["spec"]["containers"][0].pop("image"), "image"),
        (lambda o: o["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicy="Sometimes"),
         "imagePullPolicy"),
        (lambda o: o["spec"].pop("template"), "spec.template"),
        (lambda o: o["spec"]["template"]["spec"].update(nodeSelector=["pool=cpu"]), "nodeSelector"),
        (lambda o: o.pop("kind"), "kind"),
    ],
)
def test_an_object_that_cannot_be_read_is_allowed_with_a_short_warning(mangle, field):
    obj = workload("Job", pod_spec(ABSENT))
    mangle(obj)
    outcome = decide(review(obj, kind="Job"))
    reply = response(outcome)
    assert reply["allowed"] is True and "status" not in reply
    [warning] = reply["warnings"]
    assert warning.startswith("image-preflight could not read the object")
    assert_warnings_within_limits(reply["warnings"])
    assert outcome.decision == "unreadable"
    assert field in outcome.log_record()["detail"]


def test_a_null_object_on_create_is_allowed_with_a_warning():
    rv = review(workload("Job", pod_spec(ABSENT)))
    rv["request"]["object"] = None
    outcome = decide(rv)
    assert response(outcome)["allowed"] is True and response(outcome)["warnings"]


@pytest.mark.parametrize("kind", [["Job"], None, {"kind": "Job"}, 7])
def test_a_request_kind_of_the_wrong_shape_passes_untouched(kind):
    rv = review(workload("Job", pod_spec(ABSENT)))
    rv["request"]["kind"] = {"group": "batch", "version": "v1", "kind": kind}
    assert_untouched(admit(rv, INVENTORY, Settings(), now=NOW))


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not an AdmissionReview"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), "not an AdmissionReview"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                     "request": {"uid": "u"}}).encode(), "admission.k8s.io/v1beta1"),
        (json.dumps({"apiVersion": API_VERSION, "kind": "AdmissionReview"}).encode(), "request.uid"),
        (json.dumps({"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": {"uid": ""}}).encode(),
         "request.uid"),
    ],
)
def test_a_body_that_is_not_an_admission_review_is_refused(body, complaint):
    with pytest.raises(BadReview, match=complaint):
        parse_review(body)


# --- limits on what the apiserver relays ------------------------------------------------------------


def test_many_missing_images_on_many_nodes_fit_in_one_kib_with_counts_and_advice():
    images = [f"swebench/sweb.eval.x86_64.project__repo-{i:05d}:openai" for i in range(40)]
    inventory = Inventory(tuple(node(f"cpu-node-{i:03d}.cluster.example.com", labels=CPU) for i in range(60)))
    outcome = decide(review(workload("Job", pod_spec(*images))), inventory)
    message = response(outcome)["status"]["message"]

    assert len(message.encode()) <= messages.MAX_MESSAGE
    assert images[0] in message
    assert "and 55 more" in message  # nodes beyond the five named
    shown = sum(image in message for image in images)
    assert 0 < shown < len(images)
    assert f"and {len(images) - shown} more image(s)" in message
    assert message.endswith(messages.ADVICE)
    assert fails_at_once(apiserver_error(message))


def test_one_enormous_clause_is_clipped_and_keeps_the_advice():
    image = "registry.example.com/" + "/".join(["segment"] * 30) + ":openai"
    names = [f"node-{i}-" + "x" * 200 for i in range(6)]
    outcome = decide(review(workload("Job", pod_spec(image))), Inventory(tuple(node(n, labels=CPU) for n in names)))
    message = response(outcome)["status"]["message"]
    assert len(message.encode()) <= messages.MAX_MESSAGE
    assert message.startswith("invalid: ") and message.endswith(messages.ADVICE)


def test_warnings_stay_short_unique_and_under_four_kib_in_total():
    images = [f"docker.io/team/{'very-long-repository-name-' * 3}{i}:latest" for i in range(200)]
    images += images[:10]  # the same image in two containers warns once
    outcome = decide(review(workload("Job", pod_spec(*images, policy="Always"))))
    warnings = response(outcome)["warnings"]
    assert_warnings_within_limits(warnings)
    assert 20 < len(warnings) < 200  # clipped each, and cut at the total


def test_unknown_warnings_name_at_most_five_nodes():
    inventory = Inventory(tuple(node(f"n{i}", complete=False, labels=CPU) for i in range(9)))
    [warning] = response(decide(review(workload("Job", pod_spec(ABSENT))), inventory))["warnings"]
    assert "and 4 more" in warning and len(warning) <= messages.MAX_WARNING


# --- the text agent-lightning sees -------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        pod_spec(ABSENT),
        pod_spec("Swesmith/UPPER:openai"),
        pod_spec(":openai"),  # a row without image_name renders this
        pod_spec(ABSENT, HELD, "python:3.11", policy="Never"),
    ],
)
def test_every_denial_fails_the_agent_lightning_rollout_at_once(spec):
    reply = response(decide(review(workload("Job", spec))))
    assert reply["allowed"] is False
    full = apiserver_error(reply["status"]["message"])
    assert fails_at_once(full)
    assert reply["status"]["message"].startswith("invalid")


def test_the_agent_lightning_check_rejects_text_without_its_words():
    # The check itself must be able to fail, or the tests above prove nothing.
    assert not fails_at_once(apiserver_error("image missing on cpu-1"))


def test_the_log_record_names_what_was_decided():
    outcome = decide(review(workload("Job", pod_spec(ABSENT, HELD))))
    record = outcome.log_record()
    assert record == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": "Job", "namespace": "agl", "name": "rollout-7f3a",
        "operation": "CREATE", "decision": "deny", "images": [ABSENT, HELD], "detail": record["detail"],
    }
    assert ABSENT in record["detail"] and HELD not in record["detail"]


def test_the_readme_example_review_is_denied_against_the_example_nodes():
    from pathlib import Path

    from image_preflight.files.inventory import load_inventory_file

    root = Path(__file__).resolve().parents[2] / "examples" / "swe-smith"
    review = parse_review((root / "admission-review.json").read_bytes())
    outcome = admit(review, load_inventory_file(root / "nodes.json"), Settings())
    response = outcome.review["response"]
    assert response["uid"] == review["request"]["uid"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    message = response["status"]["message"]
    assert "'jyangballin/swesmith.x86_64.getmoto_1776_moto.694ce1f4:openai' (container 'agent'" in message
    assert "eligible node(s) cpu-node-1;" in message  # gpu-node-1 is tainted nvidia.com/gpu:NoSchedule


def test_a_daemonset_is_decided_on_the_cordoned_nodes_its_controller_still_uses():
    """pkg/controller/daemon: daemon pods tolerate a cordon, so a cordoned node lacking the image
    gets a pod that waits in ImagePullBackOff."""
    cordon = (Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),)
    cordoned = NodeImages.from_names("cordoned", ["docker.io/library/other:1"],
                                     traits=NodeTraits("cordoned", {"pool": "cpu"}, cordon, True))
    inventory = Inventory((node("cpu-1", ABSENT, labels=CPU), cordoned))
    assert response(decide(review(workload("Deployment", pod_spec(ABSENT))), inventory))["allowed"] is True
    denied = response(decide(review(workload("DaemonSet", pod_spec(ABSENT))), inventory))
    assert denied["allowed"] is False and "cordoned" in denied["status"]["message"]
