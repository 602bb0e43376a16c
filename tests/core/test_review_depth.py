"""A review nested nearly as deep as the parser reads (1,024 levels) overflows Python's stack
wherever one of its values is shown or compared: such a review is a BadReview naming the field,
never a RecursionError (which the webhook answers "internal error, not checked")."""

from __future__ import annotations

import sys

import pytest

from image_preflight.core.admission.body import MAX_DEPTH, BadReview, parse_review, refusing_deep_reviews
from image_preflight.core.admission.mutation import steer
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.core.decide.inventory import Inventory
from tests.builders.deep_reviews import FIELDS, NEAR_THE_PARSER_LIMIT, POD_FIELDS, SHOWN, SHOWN_IN_JOBS, body

orjson = pytest.importorskip("orjson", reason="the webhook's parser, of the webhook extra")


def parsed(field: str, kind: str = "Job", depth: int = NEAR_THE_PARSER_LIMIT) -> dict:
    return parse_review(body(FIELDS[field](kind), depth, field), loads=orjson.loads)


@pytest.fixture(autouse=True)
def shallow_stack():
    """Python's limit just above this test's own frames: a walk that recurses per level of the
    review overflows here whatever called it, as in the webhook's deeper stack."""
    limit = sys.getrecursionlimit()
    frames, frame = 0, sys._getframe()
    while frame is not None:
        frames, frame = frames + 1, frame.f_back
    sys.setrecursionlimit(frames + 200)
    yield
    sys.setrecursionlimit(limit)


@pytest.mark.parametrize("field", [*SHOWN, *SHOWN_IN_JOBS])
def test_a_review_too_deep_to_answer_is_a_bad_review_naming_the_field(field):
    with pytest.raises(BadReview) as refused:
        admit(parsed(field), Inventory(()), Settings())
    message = str(refused.value)
    assert message.startswith(field) and f"nested more than {MAX_DEPTH} levels deep" in message
    assert "\n" not in message and len(message) < 300


@pytest.mark.parametrize("field", SHOWN)
def test_mutate_refuses_it_alike(field):
    with pytest.raises(BadReview, match=f"nested more than {MAX_DEPTH} levels deep"):
        steer(parsed(field, "Pod"), Inventory(()), Settings(steer=True))




@pytest.mark.parametrize("answer,kind,field", [
    *((admit, "Job", f) for f in FIELDS), *((steer, "Job", f) for f in FIELDS),
    *((answer, "Pod", f) for answer in (admit, steer) for f in (*SHOWN, *POD_FIELDS))])
def test_every_deep_review_is_answered_or_refused_never_an_overflow(answer, kind, field):
    build = {**FIELDS, **POD_FIELDS}[field]
    review = parse_review(body(build(kind), NEAR_THE_PARSER_LIMIT, field), loads=orjson.loads)
    try:
        result = answer(review, Inventory(()), Settings(steer=True))
    except BadReview as refused:
        assert str(refused).startswith(field) and "nested more than" in str(refused)
    else:
        response = result.review["response"]
        assert response["uid"] == "u1" and isinstance(response["allowed"], bool)


def test_the_bound_is_not_a_limit_on_reviews_that_answer():
    # A review nested deeper than MAX_DEPTH, but shallow enough to answer, is answered.
    review = parsed("request.object.metadata.labels", depth=MAX_DEPTH + 10)
    assert admit(review, Inventory(()), Settings()).review["response"]["allowed"] is True


def test_an_overflow_of_a_shallow_review_stays_an_error():
    @refusing_deep_reviews
    def broken(review, inventory, settings, *, now=None):
        raise RecursionError("a bug")

    with pytest.raises(RecursionError, match="a bug"):
        broken(parsed("request.dryRun", depth=3), Inventory(()), Settings())


def test_the_standard_library_parser_refuses_it_as_too_deep():
    with pytest.raises(BadReview, match="nested too deeply"):
        parse_review(body(SHOWN["request.object.metadata.namespace"]("Job"), NEAR_THE_PARSER_LIMIT))
