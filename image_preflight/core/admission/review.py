"""AdmissionReview in, AdmissionReview out: the webhook's decision, pure and I/O-free."""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from image_preflight.core.admission import messages
from image_preflight.core.decide.decision import REQUIREMENTS, Requirement, Verdict, decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.objects import as_mapping, is_mapping
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
from image_preflight.errors import InputError

API_VERSION = "admission.k8s.io/v1"


class Mode(StrEnum):
    """What `serve --mode` does with a pod the decision denies."""

    ENFORCE = "enforce"  # deny it
    WARN = "warn"  # allow it with warnings that say why enforce would deny it
    AUDIT = "audit"  # allow it; only the decision log line and metrics say so


MODES = tuple(Mode)
ENFORCE, WARN, AUDIT = MODES
# What `serve --unknown` does with an unknown verdict (partial or stale inventory, no eligible node).
UNKNOWN_POLICIES = (Verdict.ALLOW, Verdict.DENY)


class ReviewDecision(StrEnum):
    """What the webhook made of one review: the decision log line's `decision`, the metric's label."""

    ALLOW = Verdict.ALLOW.value
    DENY = Verdict.DENY.value
    UNKNOWN = Verdict.UNKNOWN.value  # allowed, unless --unknown deny
    NO_ELIGIBLE_NODE = Verdict.NO_ELIGIBLE_NODE.value
    WARN = Mode.WARN.value  # denied by the rules, allowed with warnings by the mode
    AUDIT = Mode.AUDIT.value  # denied by the rules, allowed by the mode
    SKIP = "skip"  # not a review this webhook decides (kind, operation, subresource, not placeable)
    UNREADABLE = "unreadable"  # the object cannot be read: allowed with a warning
    ERROR = "error"  # the webhook failed: allowed with a warning, "not checked"
    STEERED = "steered"  # /mutate: patched to the nodes that hold the images
    NOT_STEERED = "not-steered"  # /mutate: allowed unchanged, the detail says why


_OF_VERDICT = {verdict: ReviewDecision(verdict.value) for verdict in Verdict}
# The API group each workload kind is decided for (other groups' same-named kinds pass).
_GROUPS = {"Pod": "", "PodTemplate": "", "ReplicationController": "", "Job": "batch", "CronJob": "batch",
           "Deployment": "apps", "StatefulSet": "apps", "DaemonSet": "apps", "ReplicaSet": "apps"}


# Deeper than this is no workload: a CronJob's deepest field, a pod affinity term's values, sits
# about 20 levels into the review. See refusing_deep_reviews.
MAX_DEPTH = 100

# A log line names at most this many images, each clipped: a review of 16,000 images, or of one
# 1 MiB image, must not become a log line of that size.
LOGGED_IMAGES, LOGGED_CHARS = 20, 512


class BadReview(InputError):
    """Not an AdmissionReview this webhook can answer (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Settings:
    mode: Mode = Mode.ENFORCE
    unknown: Verdict = Verdict.ALLOW  # what an unknown verdict does: one of UNKNOWN_POLICIES
    require: Requirement = Requirement.ALL  # for Pods; and for templates unless steering
    # Steering on (`serve --steer`): Pods are restricted to the nodes holding their images at
    # /mutate, so Jobs and other templates need only one eligible node holding every image.
    steer: bool = False
    max_steer_nodes: int = DEFAULT_MAX_NODES

    def __post_init__(self) -> None:
        # Words from flags or files become members here, or a ValueError naming the field.
        for name, words, allowed in (("mode", Mode, MODES), ("unknown", Verdict, UNKNOWN_POLICIES),
                                     ("require", Requirement, REQUIREMENTS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
            if type(value) is not words:
                object.__setattr__(self, name, words(value))

    def require_for(self, kind: str) -> Requirement:
        return Requirement.ONE_NODE if self.steer and kind != "Pod" else self.require


@dataclass(slots=True)
class Answer:
    """The AdmissionReview answering one review, plus what the decision log line and metrics need."""

    review: dict
    decision: ReviewDecision
    kind: str = ""
    namespace: str = ""
    name: str = ""
    operation: str = ""
    uid: str = ""
    images: list[str] = field(default_factory=list)
    detail: str = ""

    @classmethod
    def of(cls, request: Mapping, obj: Mapping) -> "Answer":
        """Not yet decided: what the request says about itself."""
        kind_info, metadata = as_mapping(request.get("kind")), as_mapping(obj.get("metadata"))
        return cls(
            review={},
            decision=ReviewDecision.SKIP,
            kind=str(kind_info.get("kind", "")),
            namespace=str(request.get("namespace") or metadata.get("namespace") or ""),
            name=str(request.get("name") or metadata.get("name") or metadata.get("generateName") or ""),
            operation=str(request.get("operation", "")),
            uid=request["uid"],
        )

    def log_record(self) -> dict:
        images = self.images
        if len(images) > LOGGED_IMAGES or max(map(len, images), default=0) > LOGGED_CHARS:  # else as they are
            images = [i if len(i) <= LOGGED_CHARS else i[:LOGGED_CHARS] + "..." for i in images[:LOGGED_IMAGES]]
            if len(self.images) > LOGGED_IMAGES:
                images.append(f"... and {len(self.images) - LOGGED_IMAGES} more")
        record = {"uid": self.uid, "kind": self.kind, "namespace": self.namespace, "name": self.name,
                  "operation": self.operation, "decision": self.decision, "images": images}
        if self.detail:
            record["detail"] = self.detail
        return record


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


def refusing_deep_reviews(answer: Callable[..., Answer]) -> Callable[..., Answer]:
    """`answer` (admit, steer), with a review nested too deep for it a BadReview naming the field.

    The parser reads 1,024 levels; repr, json and copy recurse once per level against Python's
    limit of 1,000 frames, so such a review can overflow wherever a value is shown or compared
    (its name in the log line, a pull policy in a message). The walk that names the field keeps a
    stack of its own, and runs only then: walking, or even counting the brackets of, every review
    would cost a sixth of an answer."""

    @functools.wraps(answer)
    def refusing(review: Mapping, inventory: Inventory, settings: Settings, *, now: float | None = None) -> Answer:
        try:
            return answer(review, inventory, settings, now=now)
        except RecursionError:
            too_deep = _too_deep(review, MAX_DEPTH)
            if too_deep is None:
                raise  # not the review's depth: an internal error
            raise BadReview(f"{too_deep}: nested more than {MAX_DEPTH} levels deep") from None

    return refusing


def _too_deep(value: object, limit: int) -> str | None:
    """Where `value` holds an object or array more than `limit` levels deep, or None. A walk with
    a stack of its own: Python's would overflow where the value is deep enough to matter."""
    stack: list[tuple[object, int, tuple | None]] = [(value, 0, None)]  # (value, depth, path as (parent, key))
    while stack:
        value, depth, path = stack.pop()
        if depth > limit:
            return _field(path)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1, (path, key)))
    return None


def _field(path: tuple | None, shown: int = 8) -> str:
    """`path` as request.object.metadata.namespace[0]..., its first `shown` steps."""
    keys = []
    while path is not None:
        path, key = path
        keys.append(key)
    keys.reverse()
    text = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys[:shown]).lstrip(".")
    return text + ("..." if len(keys) > shown else "")


@refusing_deep_reviews
def admit(review: Mapping, inventory: Inventory, settings: Settings, *, now: float | None = None) -> Answer:
    """Decide a parsed AdmissionReview (see parse_review). Raises BadReview for one nested too deep
    to answer (see refusing_deep_reviews)."""
    request = review["request"]
    kind_info, obj = as_mapping(request.get("kind")), as_mapping(request.get("object"))
    answer = Answer.of(request, obj)
    if not _in_scope(request, kind_info, obj):
        return reply(answer, review, allowed=True)
    try:
        decision = decide(pod_spec_of(obj), inventory, require=settings.require_for(answer.kind), now=now,
                          kind=answer.kind)
    except (WorkloadError, SchedulingSpecError) as exc:
        answer.decision, answer.detail = ReviewDecision.UNREADABLE, str(exc)
        return reply(answer, review, allowed=True, warnings=[f"image-preflight could not read the object: {exc}"])
    answer.images = [v.image.image for v in decision.verdicts]
    warnings = messages.not_checked_warnings(decision)
    verdict = decision.outcome
    decided = verdict in (Verdict.ALLOW, Verdict.DENY)
    denied = verdict == Verdict.DENY or (not decided and settings.unknown == Verdict.DENY)
    if not decided:
        warnings = messages.unknown_warnings(decision) + warnings
    answer.decision = _OF_VERDICT[verdict]
    if not denied:
        return reply(answer, review, allowed=True, warnings=warnings)
    if verdict == Verdict.DENY:
        message = messages.denial_message(decision)
    else:
        message = messages.unconfirmed_message(decision)
    answer.detail = message  # the log line says what enforce mode denies, in every mode
    if settings.mode == Mode.AUDIT:
        answer.decision = ReviewDecision.AUDIT
        return reply(answer, review, allowed=True, warnings=warnings)
    if settings.mode == Mode.WARN:
        answer.decision = ReviewDecision.WARN
        return reply(answer, review, allowed=True, warnings=messages.missing_warnings(decision) + warnings)
    answer.decision = ReviewDecision.DENY
    return reply(answer, review, allowed=False, message=message, warnings=warnings)


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
    if not is_mapping(obj):
        return True
    spec = obj.get("spec")  # type: ignore[union-attr]
    if not is_mapping(spec):
        return True
    if obj.get("kind") == "Job" and spec.get("suspend") is True:  # type: ignore[union-attr]
        return False
    return not (obj.get("kind") == "Pod" and spec.get("schedulingGates"))  # type: ignore[union-attr]


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
    answer: Answer, review: Mapping, *, allowed: bool, message: str = "", warnings: list[str] | None = None,
    patch: str | None = None,
) -> Answer:
    """Complete `answer` with the AdmissionReview answering `review`; `patch` a JSONPatch as JSON.
    Every AdmissionReview the webhook sends is built here."""
    response: dict = {"uid": answer.uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 422, "reason": "Invalid", "message": message}
    if warnings:
        response["warnings"] = messages.limit_warnings(warnings)
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch.encode()).decode("ascii")
    answer.review = {"apiVersion": review["apiVersion"], "kind": review["kind"], "response": response}
    return answer


def internal_error(review: Mapping, exc: Exception) -> Answer:
    """The answer when deciding `review` failed: allowed, "not checked", never a 500 (the apiserver
    would apply failurePolicy blindly). Built from the uid alone: the rest may be what failed."""
    request = review["request"]
    operation = request.get("operation")
    answer = Answer(review={}, decision=ReviewDecision.ERROR, uid=request["uid"],
                    operation=operation if isinstance(operation, str) else "", detail=str(exc))
    return reply(answer, review, allowed=True,
                 warnings=[f"image-preflight: internal error, not checked ({type(exc).__name__})"])


def refusal(message: str) -> dict:
    """The body of an HTTP error (400, 408, 413): the request is not a review this webhook can
    answer, so there is no uid to answer with, and the apiserver treats the call as failed."""
    return {"error": message}

