"""The deciding fields (workloads.deciding_fields) are one definition: the decision reads nothing
else of a pod spec, and the memory's key, the scanner's shapes and the webhook's UPDATE scope all
compare exactly them. Container names are among them: they label the decision's messages."""

from __future__ import annotations

import copy

import pytest

from image_preflight.core.admission.scope import in_scope
from image_preflight.core.decide.decision import decide
from image_preflight.core.decide.memory import key_of
from image_preflight.core.decide.workloads import deciding_fields
from image_preflight.core.rows.slots import shape_of
from tests.builders.inventories import NOW, inv, node
from tests.builders.reviews import ABSENT, HELD

SPEC = {
    "restartPolicy": "Never",
    "initContainers": [{"name": "setup", "image": HELD, "command": ["true"]}],
    "containers": [{"name": "agent", "image": ABSENT, "imagePullPolicy": "IfNotPresent",
                    "env": [{"name": "A", "value": "1"}], "volumeMounts": [{"name": "tools", "mountPath": "/t"}]}],
    "volumes": [{"name": "scratch", "emptyDir": {}},
                {"name": "tools", "image": {"reference": ABSENT, "pullPolicy": "IfNotPresent"}}],
    "nodeSelector": {"pool": "cpu"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


def _set(path: tuple, value):
    def change(spec: dict) -> None:
        *parents, last = path
        for key in parents:
            spec = spec[key]
        spec[last] = value
    return change


NOT_READ = {
    "env": _set(("containers", 0, "env"), []),
    "command": _set(("initContainers", 0, "command"), ["false"]),
    "restartPolicy": _set(("restartPolicy",), "OnFailure"),
    "a volume's source": _set(("volumes", 0, "emptyDir"), {"medium": "Memory"}),
    "the name of a volume without an image": _set(("volumes", 0, "name"), "other"),
    "a field the decision never reads": _set(("serviceAccountName",), "agent"),
}
READ = {
    "a container's name": _set(("containers", 0, "name"), "rollout"),
    "an init container's image": _set(("initContainers", 0, "image"), ABSENT),
    "a pull policy": _set(("containers", 0, "imagePullPolicy"), "Always"),
    "an image volume's name": _set(("volumes", 1, "name"), "kit"),
    "an image volume's reference": _set(("volumes", 1, "image", "reference"), HELD),
    "which volumes a container mounts, beside an image volume": _set(("containers", 0, "volumeMounts"), []),
    # Messages number volumes: a volume without an image still holds its place.
    "a volume before an image volume": lambda spec: spec["volumes"].pop(0),
    "the node selector": _set(("nodeSelector",), {"pool": "gpu"}),
    "the tolerations": _set(("tolerations",), []),
    "the node name": _set(("nodeName",), "cpu-1"),
}


def _changed(change) -> dict:
    spec = copy.deepcopy(SPEC)
    change(spec)
    return spec


def _job(spec: dict) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "rollout"},
            "spec": {"template": {"spec": spec}}}


def _decided(spec: dict):
    """The decision on a fresh inventory (nothing remembered), or the error it raises."""
    inventory = inv(node("cpu-1", "docker.io/library/" + HELD, labels={"pool": "cpu"}),
                    node("gpu-1", "docker.io/library/" + HELD, labels={"pool": "gpu"}))
    try:
        return decide(spec, inventory, now=NOW)
    except Exception as exc:  # noqa: BLE001 - the error is the decision's answer
        return type(exc), str(exc)


def _update_decided(old: dict, new: dict) -> bool:
    request = {"operation": "UPDATE", "oldObject": _job(old)}
    return in_scope(request, {"group": "batch", "kind": "Job"}, _job(new))


def _views(spec: dict) -> tuple:
    shape = shape_of("", spec, {}, [])
    return key_of(spec, "Job", "all", False), shape.fields


@pytest.mark.parametrize("what", sorted(NOT_READ))
def test_what_the_decision_does_not_read_changes_none_of_the_three(what):
    spec = _changed(NOT_READ[what])
    assert deciding_fields(spec) == deciding_fields(SPEC)
    assert _decided(spec) == _decided(SPEC)
    assert _views(spec) == _views(SPEC)
    assert not _update_decided(SPEC, spec)


@pytest.mark.parametrize("what", sorted(READ))
def test_what_the_decision_reads_changes_all_three(what):
    spec = _changed(READ[what])
    assert deciding_fields(spec) != deciding_fields(SPEC)
    key, fields = _views(spec)
    old_key, old_fields = _views(SPEC)
    assert key != old_key and fields != old_fields
    assert _update_decided(SPEC, spec)


@pytest.mark.parametrize("what", ["a container's name", "an image volume's name"])
def test_names_are_read_they_label_the_decisions_messages(what):
    assert _decided(_changed(READ[what])) != _decided(SPEC)


def test_an_image_volume_no_container_mounts_is_not_decided():
    """The kubelet pulls it but holds back only the containers that mount it
    (pkg/kubelet/kuberuntime/kuberuntime_manager.go, toKubeContainerImageVolumes)."""
    unmounted = _changed(_set(("containers", 0, "volumeMounts"), [{"name": "scratch", "mountPath": "/s"}]))
    assert [v.image.label for v in _decided(SPEC).verdicts] == ["container 'setup'", "container 'agent'",
                                                                 "volume 'tools'"]
    assert [v.image.label for v in _decided(unmounted).verdicts] == ["container 'setup'", "container 'agent'"]
    assert _views(unmounted) != _views(SPEC) and _update_decided(SPEC, unmounted)


def test_mounts_are_read_only_beside_an_image_volume():
    plain = _changed(lambda spec: spec["volumes"].pop(1))
    remounted = copy.deepcopy(plain)
    remounted["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/s"}]
    assert deciding_fields(remounted) == deciding_fields(plain)
    assert _views(remounted) == _views(plain) and not _update_decided(plain, remounted)
    # Nor in a pod without volumes at all.
    bare = _changed(lambda spec: spec.pop("volumes"))
    unmounted = copy.deepcopy(bare)
    for container in (*unmounted["initContainers"], *unmounted["containers"]):
        container.pop("volumeMounts", None)
    assert deciding_fields(unmounted) == deciding_fields(bare)
    assert _views(unmounted) == _views(bare) and not _update_decided(bare, unmounted)


def test_deciding_the_deciding_fields_decides_the_whole_spec():
    for spec in [SPEC, *(_changed(c) for c in (*READ.values(), *NOT_READ.values()))]:
        assert _decided(deciding_fields(spec)) == _decided(spec)
    assert _views(SPEC)[1] == deciding_fields(SPEC)
