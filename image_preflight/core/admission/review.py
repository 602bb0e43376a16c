"""AdmissionReview in, AdmissionReview out: the webhook's decision, pure and I/O-free. The parts:
settings (what answers depend on), body (parsing, the depth guard), scope (which reviews are
decided), answers (every AdmissionReview sent, and the log line), messages (their words)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from image_preflight.core.admission import messages
from image_preflight.core.admission.answers import OF_OUTCOME, Answer, ReviewDecision, reply
from image_preflight.core.admission.body import refusing_deep_reviews
from image_preflight.core.admission.scope import in_scope
from image_preflight.core.admission.settings import Mode, Settings
from image_preflight.core.decide.decision import Outcome, decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.decide.scheduling import SchedulingSpecError
from image_preflight.core.decide.workloads import WorkloadError, pod_spec_of
from image_preflight.core.objects import as_mapping


@refusing_deep_reviews
def admit(review: Mapping[str, Any], inventory: Inventory, settings: Settings, *, now: float | None = None) -> Answer:
    """Decide a parsed AdmissionReview (see parse_review). Raises BadReview for one nested too deep
    to answer (see refusing_deep_reviews)."""
    request = review["request"]
    kind_info, obj = as_mapping(request.get("kind")), as_mapping(request.get("object"))
    answer = Answer.of(request, obj)
    if not in_scope(request, kind_info, obj):
        return reply(answer, review, allowed=True)
    try:
        decision = decide(pod_spec_of(obj), inventory, require=settings.require_for(answer.kind), now=now,
                          kind=answer.kind)
    except (WorkloadError, SchedulingSpecError) as exc:
        answer.decision, answer.detail = ReviewDecision.UNREADABLE, str(exc)
        return reply(answer, review, allowed=True, warnings=[f"image-preflight could not read the object: {exc}"])
    answer.images = [v.image.image for v in decision.verdicts]
    warnings = messages.not_checked_warnings(decision)
    outcome = decision.outcome
    decided = outcome in (Outcome.ALLOW, Outcome.DENY)
    denied = outcome == Outcome.DENY or (not decided and settings.unknown == Outcome.DENY)
    if not decided:
        warnings = messages.unknown_warnings(decision) + warnings
    answer.decision = OF_OUTCOME[outcome]
    if not denied:
        return reply(answer, review, allowed=True, warnings=warnings)
    if outcome == Outcome.DENY:
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
