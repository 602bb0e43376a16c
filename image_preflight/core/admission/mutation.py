"""POST /mutate's answer: a Pod at CREATE steered to the nodes that hold its images (core/steering).
Pure, like core/admission; the reply always allows, with or without a patch."""

from __future__ import annotations

from collections.abc import Mapping

from image_preflight.core.admission import steering
from image_preflight.core.admission.review import Outcome, Settings, reply
from image_preflight.core.decide.decision import REQUIRE_ALL, decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.objects import as_mapping
from image_preflight.core.decide.scheduling import SchedulingSpecError
from image_preflight.core.decide.workloads import WorkloadError

STEERED, NOT_STEERED = "steered", "not-steered"


def steer(review: Mapping, inventory: Inventory, settings: Settings, *, now: float | None = None) -> Outcome:
    """Decide a parsed AdmissionReview (see admission.parse_review) for the mutating webhook."""
    request = review["request"]
    obj = as_mapping(request.get("object"))
    outcome = Outcome.of(request, obj)
    kind = as_mapping(request.get("kind"))
    if (kind.get("group", ""), kind.get("kind")) != ("", "Pod") or request.get("operation") != "CREATE" \
            or request.get("subResource"):
        return reply(outcome, review, allowed=True)
    reason = steering.not_steerable(obj)
    if not reason:
        try:
            decision = decide(as_mapping(obj.get("spec")), inventory, require=REQUIRE_ALL, now=now, kind="Pod")
        except (WorkloadError, SchedulingSpecError) as exc:
            outcome.decision, outcome.detail = "unreadable", str(exc)
            return reply(outcome, review, allowed=True)
        outcome.images = [v.image.image for v in decision.verdicts]
        terms = steering.required_terms(obj)
        plan = steering.plan(decision, max_nodes=settings.max_steer_nodes, terms=len(terms or ()))
        if plan.steered:
            outcome.decision, outcome.detail = STEERED, f"{len(plan.nodes)} nodes: {', '.join(plan.nodes[:5])}"
            return reply(outcome, review, allowed=True, patch=steering.encoded_patch(obj, plan.nodes))
        reason = plan.reason
    outcome.decision, outcome.detail = NOT_STEERED, reason
    return reply(outcome, review, allowed=True)

