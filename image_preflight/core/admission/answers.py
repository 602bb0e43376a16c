"""Every AdmissionReview the webhook sends, built one way (as controller-runtime's
pkg/webhook/admission/response.go builds its answers), and the decision log line beside it."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from image_preflight.core.admission import messages
from image_preflight.core.admission.settings import Mode
from image_preflight.core.decide.decision import Outcome
from image_preflight.core.objects import as_mapping

API_VERSION = "admission.k8s.io/v1"


class ReviewDecision(StrEnum):
    """What the webhook made of one review: the decision log line's `decision`, the metric's label."""

    ALLOW = Outcome.ALLOW.value
    DENY = Outcome.DENY.value
    UNKNOWN = Outcome.UNKNOWN.value  # allowed, unless --unknown deny
    NO_ELIGIBLE_NODE = Outcome.NO_ELIGIBLE_NODE.value
    WARN = Mode.WARN.value  # denied by the rules, allowed with warnings by the mode
    AUDIT = Mode.AUDIT.value  # denied by the rules, allowed by the mode
    SKIP = "skip"  # not a review this webhook decides (kind, operation, subresource, not placeable)
    UNREADABLE = "unreadable"  # the object cannot be read: allowed with a warning
    ERROR = "error"  # the webhook failed: allowed with a warning, "not checked"
    STEERED = "steered"  # /mutate: patched to the nodes that hold the images
    NOT_STEERED = "not-steered"  # /mutate: allowed unchanged, the detail says why


OF_OUTCOME = {outcome: ReviewDecision(outcome.value) for outcome in Outcome}

# A log line names at most this many images, each clipped: a review of 16,000 images, or of one
# 1 MiB image, must not become a log line of that size.
LOGGED_IMAGES, LOGGED_CHARS = 20, 512


@dataclass(slots=True)
class Answer:
    """The AdmissionReview answering one review, plus what the decision log line and metrics need."""

    review: dict[str, Any]
    decision: ReviewDecision
    kind: str = ""
    namespace: str = ""
    name: str = ""
    operation: str = ""
    uid: str = ""
    images: list[str] = field(default_factory=list)
    detail: str = ""

    @classmethod
    def of(cls, request: Mapping[str, Any], obj: Mapping[str, Any]) -> "Answer":
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

    def log_record(self) -> dict[str, Any]:
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


def reply(
    answer: Answer, review: Mapping[str, Any], *, allowed: bool, message: str = "", warnings: list[str] | None = None,
    patch: str | None = None,
) -> Answer:
    """Complete `answer` with the AdmissionReview answering `review`; `patch` a JSONPatch as JSON.
    Every AdmissionReview the webhook sends is built here."""
    response: dict[str, Any] = {"uid": answer.uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 422, "reason": "Invalid", "message": message}
    if warnings:
        response["warnings"] = messages.limit_warnings(warnings)
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch.encode()).decode("ascii")
    answer.review = {"apiVersion": review["apiVersion"], "kind": review["kind"], "response": response}
    return answer


def internal_error(review: Mapping[str, Any], exc: Exception) -> Answer:
    """The answer when deciding `review` failed: allowed, "not checked", never a 500 (the apiserver
    would apply failurePolicy blindly). Built from the uid alone: the rest may be what failed."""
    request = review["request"]
    operation = request.get("operation")
    answer = Answer(review={}, decision=ReviewDecision.ERROR, uid=request["uid"],
                    operation=operation if isinstance(operation, str) else "", detail=str(exc))
    return reply(answer, review, allowed=True,
                 warnings=[f"image-preflight: internal error, not checked ({type(exc).__name__})"])


def refusal(message: str) -> dict[str, Any]:
    """The body of an HTTP error (400, 408, 413): the request is not a review this webhook can
    answer, so there is no uid to answer with, and the apiserver treats the call as failed."""
    return {"error": message}
