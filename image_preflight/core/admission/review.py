"""AdmissionReview in, AdmissionReview out: the webhook's decision, pure and I/O-free."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from image_preflight.core.admission import messages
from image_preflight.core.decide.decision import ALLOW, DENY, REQUIRE_ALL, REQUIRE_ONE_NODE, decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.objects import as_mapping
from image_preflight.core.decide.scheduling import SchedulingSpecError
from image_preflight.core.admission.steering import DEFAULT_MAX_NODES
from image_preflight.core.decide.workloads import (
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


# A log line names at most this many images, each clipped: a review of 16,000 images, or of one
# 1 MiB image, must not become a log line of that size.
LOGGED_IMAGES, LOGGED_CHARS = 20, 512


class BadReview(ValueError):
    """Not an AdmissionReview this webhook can answer (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Settings:
    mode: str = ENFORCE
    unknown: str = ALLOW  # what an unknown verdict (partial/stale inventory, no eligible node) does
    require: str = REQUIRE_ALL  # for Pods; and for templates unless steering
    # Steering on (`serve --steer`): Pods are restricted to the nodes holding their images at
    # /mutate, so Jobs and other templates need only one eligible node holding every image.
    steer: bool = False
    max_steer_nodes: int = DEFAULT_MAX_NODES

    def require_for(self, kind: str) -> str:
        return REQUIRE_ONE_NODE if self.steer and kind != "Pod" else self.require


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

    @classmethod
    def of(cls, request: Mapping, obj: Mapping) -> "Outcome":
        """Not yet decided: what the request says about itself."""
        kind_info, metadata = as_mapping(request.get("kind")), as_mapping(obj.get("metadata"))
        return cls(
            review={},
            decision="skip",
            kind=str(kind_info.get("kind", "")),
            namespace=str(request.get("namespace") or metadata.get("namespace") or ""),
            name=str(request.get("name") or metadata.get("name") or metadata.get("generateName") or ""),
            operation=str(request.get("operation", "")),
            uid=request["uid"],
        )

    def log_record(self) -> dict:
        images = [i if len(i) <= LOGGED_CHARS else i[:LOGGED_CHARS] + "..." for i in self.images[:LOGGED_IMAGES]]
        if len(self.images) > LOGGED_IMAGES:
            images.append(f"... and {len(self.images) - LOGGED_IMAGES} more")
        return {
            "uid": self.uid, "kind": self.kind, "namespace": self.namespace, "name": self.name,
            "operation": self.operation, "decision": self.decision, "images": images,
            **({"detail": self.detail} if self.detail else {}),
        }


def parse_review(body: bytes, *, loads: Callable[[bytes], object] | None = None) -> dict:
    """The review in `body`. `loads` parses JSON from bytes and must refuse invalid UTF-8 (the
    webhook passes orjson.loads, which also refuses lone surrogates, NaN and nesting past 1024);
    by default the standard library's, after a strict UTF-8 decode."""
    try:
        review = loads(body) if loads is not None else json.loads(body.decode("utf-8"))
    except RecursionError:
        raise BadReview("body is not JSON this webhook can read: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a number past 4,300 digits
        raise BadReview(f"body is not JSON: {' '.join(str(exc).split())[:200]}") from None
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
    outcome = Outcome.of(request, obj)
    if not _in_scope(request, kind_info, obj):
        return reply(outcome, review, allowed=True)
    try:
        decision = decide(pod_spec_of(obj), inventory, require=settings.require_for(outcome.kind), now=now,
                          kind=outcome.kind)
    except (WorkloadError, SchedulingSpecError) as exc:
        outcome.decision, outcome.detail = "unreadable", str(exc)
        return reply(outcome, review, allowed=True, warnings=[f"image-preflight could not read the object: {exc}"])
    outcome.images = [v.image.image for v in decision.verdicts]
    warnings = messages.not_checked_warnings(decision)
    denied = decision.outcome == DENY or (decision.outcome not in (ALLOW, DENY) and settings.unknown == "deny")
    if decision.outcome not in (ALLOW, DENY):
        warnings = messages.unknown_warnings(decision) + warnings
    outcome.decision = decision.outcome
    if not denied:
        return reply(outcome, review, allowed=True, warnings=warnings)
    if decision.outcome == DENY:
        message = messages.denial_message(decision)
    else:
        message = messages.unconfirmed_message(decision)
    outcome.detail = message  # the log line says what enforce mode denies, in every mode
    if settings.mode == AUDIT:
        outcome.decision = AUDIT
        return reply(outcome, review, allowed=True, warnings=warnings)
    if settings.mode == WARN:
        outcome.decision = WARN
        return reply(outcome, review, allowed=True, warnings=messages.missing_warnings(decision) + warnings)
    outcome.decision = DENY
    return reply(outcome, review, allowed=False, message=message, warnings=warnings)


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
    # Compared as JSON: any value, however malformed (the decision then calls it unreadable).
    containers = [(c.get("image"), c.get("imagePullPolicy")) if isinstance(c, Mapping) else c
                  for f in CONTAINER_FIELDS for c in _as_list(spec.get(f))]
    volumes = [v.get("image") if isinstance(v, Mapping) else v for v in _as_list(spec.get(VOLUMES))]
    return _canonical([containers, volumes, [spec.get(f) for f in SCHEDULING_FIELDS]])


def _as_list(value: object) -> list:
    return value if isinstance(value, list) else [value]


def _canonical(value: object) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):  # keys of mixed types, a cycle: compare as text
        return repr(value)


def reply(
    outcome: Outcome, review: Mapping, *, allowed: bool, message: str = "", warnings: list[str] | None = None,
    patch: str | None = None,
) -> Outcome:
    """Complete `outcome` with the AdmissionReview answering `review`; `patch` a JSONPatch as JSON."""
    response: dict = {"uid": outcome.uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 422, "reason": "Invalid", "message": message}
    if warnings:
        response["warnings"] = messages.limit_warnings(warnings)
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch.encode()).decode("ascii")
    outcome.review = {"apiVersion": review["apiVersion"], "kind": review["kind"], "response": response}
    return outcome

