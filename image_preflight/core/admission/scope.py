"""Which reviews a webhook decides: /validate the workload kinds of their own API groups, placeable
now, on CREATE, and on the UPDATE that changes their images or placement (or makes them placeable);
/mutate Pods on CREATE alone."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from image_preflight.core.decide.workloads import WORKLOAD_KINDS, WorkloadError, deciding_fields, pod_spec_of
from image_preflight.core.objects import is_mapping

# The API group each workload kind is decided for (other groups' same-named kinds pass).
GROUPS = {"Pod": "", "PodTemplate": "", "ReplicationController": "", "Job": "batch", "CronJob": "batch",
           "Deployment": "apps", "StatefulSet": "apps", "DaemonSet": "apps", "ReplicaSet": "apps"}


def in_scope(request: Mapping[str, Any], kind_info: Mapping[str, Any], obj: Mapping[str, Any], *,
             kinds: Collection[str] = WORKLOAD_KINDS, updates: bool = True) -> bool:
    """Whether a webhook decides the review: one of `kinds` of its own API group, on the object
    itself (no subresource), at CREATE, or (with `updates`) at the UPDATE that changes its images or
    placement or makes it placeable. An object not yet placeable is left for that UPDATE: its
    selector may still be narrowed. Where no UPDATE is decided (/mutate) it is taken at CREATE, and
    the answer says why it is left alone (steering.not_steerable)."""
    kind = kind_info.get("kind")
    if not isinstance(kind, str) or kind not in kinds or kind_info.get("group", "") != GROUPS[kind]:
        return False
    if request.get("subResource"):
        return False
    operation = request.get("operation")
    if operation == "CREATE":
        return not updates or placeable(obj)
    if operation == "UPDATE" and updates and placeable(obj):
        old = request.get("oldObject")
        return not placeable(old) or _placement_or_images(obj) != _placement_or_images(old)
    return False


def placeable(obj: object) -> bool:
    """Whether pods of `obj` may be placed now. A suspended Job creates no pods
    (pkg/controller/job/job_controller.go, syncJob) and a Pod with schedulingGates is not
    scheduled (pkg/scheduler/framework/plugins/schedulinggates); Kueue holds both, narrows the
    selector and releases them with an UPDATE, which is then decided whatever else it changed."""
    if not is_mapping(obj):
        return True
    spec = obj.get("spec")
    if not is_mapping(spec):
        return True
    if obj.get("kind") == "Job" and spec.get("suspend") is True:
        return False
    return not (obj.get("kind") == "Pod" and spec.get("schedulingGates"))


def _placement_or_images(obj: object) -> object:
    """What an UPDATE must change for the verdict to change (Kueue sets nodeSelector on unsuspend):
    the deciding fields, compared as JSON whatever their values."""
    try:
        return _canonical(deciding_fields(pod_spec_of(obj)))
    except WorkloadError:
        return None


def _canonical(value: object) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):  # keys of mixed types, a cycle: compare as text
        return repr(value)
