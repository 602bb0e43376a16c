"""AdmissionReview in, AdmissionReview out: the webhook's decision, pure and I/O-free."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from image_preflight.core import messages
from image_preflight.core.decision import ALLOW, DENY, REQUIRE_ALL, decide
from image_preflight.core.inventory import Inventory
from image_preflight.core.scheduling import SchedulingSpecError
from image_preflight.core.workloads import (
    CONTAINER_FIELDS,
    SCHEDULING_FIELDS,
    VOLUMES,
    WORKLOAD_KINDS,
    WorkloadError,
    pod_spec_of,
)

API_VERSION = "admission.k8s.io/v1"
ENFORCE, WARN, AUDIT = "enforce", "warn", "audit"
MODES = (ENFORCE, WARN, AUDIT)
# The API group each workload kind is decided for (other groups' same-named kinds pass).
_GROUPS = {"Pod": "", "PodTemplate": "", "ReplicationController": "", "Job": "batch", "CronJob": "batch",
           "Deployment": "apps", "StatefulSet": "apps", "DaemonSet": "apps", "ReplicaSet": "apps"}


class BadReview(ValueError):
    """Not an AdmissionReview this webhook can answer (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Settings:
    mode: str = ENFORCE
    unknown: str = ALLOW  # what an unknown verdict (partial/stale inventory, no eligible node) does
    require: str = REQUIRE_ALL


@dataclass(slots=True)
class Outcome:
    """The reply plus what the decision log line and metrics need."""

    review: dict
    decision: str  # allow | deny | warn | audit | skip | unreadable
    kind: str = ""
    namespace: str = ""
    name: str = ""
    operation: str = ""
    uid: str = ""
    images: list[str] = field(default_factory=list)
    detail: str = ""

    def log_record(self) -> dict:
        return {
            "uid": self.uid, "kind": self.kind, "namespace": self.namespace, "name": self.name,
            "operation": self.operation, "decision": self.decision, "images": self.images,
            **({"detail": self.detail} if self.detail else {}),
        }


def parse_review(body: bytes) -> dict:
    try:
        review = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadReview(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise BadReview("body is not JSON this webhook can read: nested too deeply") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadReview("body is not an AdmissionReview")
    if review.get("apiVersion") != API_VERSION:
        raise BadReview(f"apiVersion {review.get('apiVersion')!r} is not {API_VERSION}")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("request.uid: missing")
    return review


def admit(review: Mapping, inventory: Inventory, settings: Settings, *, now: float | None = None) -> Outcome:
    """Decide a parsed AdmissionReview (see parse_review)."""
    request = review["request"]
    kind_info = request.get("kind") if isinstance(request.get("kind"), Mapping) else {}
    obj = request.get("object") if isinstance(request.get("object"), Mapping) else {}
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    outcome = Outcome(
        review={},
        decision="skip",
        kind=str(kind_info.get("kind", "")),
        namespace=str(request.get("namespace") or metadata.get("namespace") or ""),
        name=str(request.get("name") or metadata.get("name") or metadata.get("generateName") or ""),
        operation=str(request.get("operation", "")),
        uid=request["uid"],
    )
    if not _in_scope(request, kind_info, obj):
        return _reply(outcome, review, allowed=True)
    try:
        decision = decide(pod_spec_of(obj), inventory, require=settings.require, now=now, kind=outcome.kind)
    except (WorkloadError, SchedulingSpecError) as exc:
        outcome.decision, outcome.detail = "unreadable", str(exc)
        return _reply(outcome, review, allowed=True, warnings=[f"image-preflight could not read the object: {exc}"])
    outcome.images = [v.image.image for v in decision.verdicts]
    warnings = messages.not_checked_warnings(decision)
    denied = decision.outcome == DENY or (decision.outcome not in (ALLOW, DENY) and settings.unknown == "deny")
    if decision.outcome not in (ALLOW, DENY):
        warnings = messages.unknown_warnings(decision) + warnings
    outcome.decision = decision.outcome
    if not denied:
        return _reply(outcome, review, allowed=True, warnings=warnings)
    if decision.outcome == DENY:
        message = messages.denial_message(decision)
    else:
        message = messages.unconfirmed_message(decision)
    outcome.detail = message  # the log line says what enforce mode denies, in every mode
    if settings.mode == AUDIT:
        outcome.decision = AUDIT
        return _reply(outcome, review, allowed=True, warnings=warnings)
    if settings.mode == WARN:
        outcome.decision = WARN
        return _reply(outcome, review, allowed=True, warnings=messages.missing_warnings(decision) + warnings)
    outcome.decision = DENY
    return _reply(outcome, review, allowed=False, message=message, warnings=warnings)


def _in_scope(request: Mapping, kind_info: Mapping, obj: Mapping) -> bool:
    kind = kind_info.get("kind")
    if not isinstance(kind, str) or kind not in WORKLOAD_KINDS or kind_info.get("group", "") != _GROUPS[kind]:
        return False
    if request.get("subResource"):
        return False
    if not placeable(obj):
        return False  # decided when it becomes placeable: its selector may still be narrowed
    operation = request.get("operation")
    if operation == "CREATE":
        return True
    if operation == "UPDATE":
        old = request.get("oldObject")
        return not placeable(old) or _placement_or_images(obj) != _placement_or_images(old)
    return False


def placeable(obj: object) -> bool:
    """Whether pods of `obj` may be placed now. A suspended Job creates no pods
    (pkg/controller/job/job_controller.go, syncJob) and a Pod with schedulingGates is not
    scheduled (pkg/scheduler/framework/plugins/schedulinggates); Kueue holds both, narrows the
    selector and releases them with an UPDATE, which is then decided whatever else it changed."""
    if not isinstance(obj, Mapping):
        return True
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return True
    if obj.get("kind") == "Job" and spec.get("suspend") is True:
        return False
    return not (obj.get("kind") == "Pod" and spec.get("schedulingGates"))


def _placement_or_images(obj: object) -> object:
    """What an UPDATE must change for the verdict to change (Kueue sets nodeSelector on unsuspend)."""
    try:
        spec = pod_spec_of(obj)  # type: ignore[arg-type]
    except WorkloadError:
        return None
    containers = tuple(
        (c.get("image"), c.get("imagePullPolicy"))
        for f in CONTAINER_FIELDS
        for c in (spec.get(f) or [])
        if isinstance(c, Mapping)
    ) + tuple(json.dumps(v.get("image"), sort_keys=True, default=str)
              for v in (spec.get(VOLUMES) or []) if isinstance(v, Mapping) and "image" in v)
    return containers, json.dumps([spec.get(f) for f in SCHEDULING_FIELDS], sort_keys=True, default=str)


def _reply(
    outcome: Outcome, review: Mapping, *, allowed: bool, message: str = "", warnings: list[str] | None = None
) -> Outcome:
    response: dict = {"uid": outcome.uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 422, "reason": "Invalid", "message": message}
    if warnings:
        response["warnings"] = messages.limit_warnings(warnings)
    outcome.review = {"apiVersion": review["apiVersion"], "kind": review["kind"], "response": response}
    return outcome

