"""A review's body: parsed (or a BadReview, HTTP 400), and refused when nested too deep to answer."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from image_preflight.core.admission.answers import API_VERSION, Answer
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.objects import deeper_than, field_path
from image_preflight.errors import InputError

# Deeper than this is no workload: a CronJob's deepest field, a pod affinity term's values, sits
# about 20 levels into the review. See refusing_deep_reviews.
MAX_DEPTH = 100


class BadReview(InputError):
    """Not an AdmissionReview this webhook can answer (HTTP 400)."""


def parse_review(body: bytes, *, loads: Callable[[bytes], object] | None = None) -> dict[str, Any]:
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
    def refusing(review: Mapping[str, Any], inventory: Inventory, settings: Settings, *,
                 now: float | None = None) -> Answer:
        try:
            return answer(review, inventory, settings, now=now)
        except RecursionError:
            too_deep = _too_deep(review, MAX_DEPTH)
            if too_deep is None:
                raise  # not the review's depth: an internal error
            raise BadReview(f"{too_deep}: nested more than {MAX_DEPTH} levels deep") from None

    return refusing


def _too_deep(value: object, limit: int) -> str | None:
    """Where `value` holds an object or array more than `limit` levels deep, or None."""
    keys = deeper_than(value, limit)
    return None if keys is None else field_path(keys, 8)
