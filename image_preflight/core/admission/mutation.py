"""POST /mutate's answer: a Pod at CREATE steered to the nodes that hold its images (core/steering).
Pure, like core/admission; the reply always allows, with or without a patch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from image_preflight.core.admission import steering
from image_preflight.core.admission.answers import Answer, ReviewDecision, reply
from image_preflight.core.admission.body import refusing_deep_reviews
from image_preflight.core.admission.scope import in_scope
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.decision import Requirement, decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.decide.scheduling import SchedulingSpecError
from image_preflight.core.decide.workloads import WorkloadError
from image_preflight.core.objects import as_mapping

# Steered as they are created: a Pod's node affinity is fixed from then on (an UPDATE may narrow it
# only while the Pod is gated, and steering leaves a gated Pod alone).
STEERED_KINDS = frozenset({"Pod"})


@refusing_deep_reviews
def steer(review: Mapping[str, Any], inventory: Inventory, settings: Settings, *, now: float | None = None) -> Answer:
    """Decide a parsed AdmissionReview (see review.parse_review) for the mutating webhook; raises
    BadReview as admit does."""
    request = review["request"]
    obj = as_mapping(request.get("object"))
    answer = Answer.of(request, obj)
    if not in_scope(request, as_mapping(request.get("kind")), obj, kinds=STEERED_KINDS, updates=False):
        return reply(answer, review, allowed=True)
    reason = steering.not_steerable(obj)
    if reason is None:
        try:
            decision = decide(as_mapping(obj.get("spec")), inventory, require=Requirement.ALL, now=now, kind="Pod")
        except (WorkloadError, SchedulingSpecError) as exc:
            answer.decision, answer.detail = ReviewDecision.UNREADABLE, str(exc)
            return reply(answer, review, allowed=True)
        answer.images = [v.image.image for v in decision.verdicts]
        terms = steering.required_terms(obj)
        plan = steering.plan(decision, max_nodes=settings.max_steer_nodes, terms=len(terms or ()))
        if plan.steered:
            answer.decision = ReviewDecision.STEERED
            answer.detail = f"{len(plan.nodes)} nodes: {', '.join(plan.nodes[:5])}"
            return reply(answer, review, allowed=True, patch=steering.encoded_patch(obj, plan.nodes))
        reason = plan.reason
    answer.decision, answer.detail = ReviewDecision.NOT_STEERED, reason or ""
    return reply(answer, review, allowed=True)
