"""`serve` over real TLS against reviews nested nearly as deep as its parser reads (1,024 levels):
a proper answer, or a one-line 400 naming the field; never "internal error, not checked"."""

from __future__ import annotations

import json
import logging

import pytest

from image_preflight.core.admission.body import MAX_DEPTH
from tests.builders.deep_reviews import FIELDS, NEAR_THE_PARSER_LIMIT, POD_FIELDS, SHOWN, body
from tests.builders.reviews import EXAMPLE_NODES
from tests.serving import HOST, serving_webhooks


@pytest.fixture(scope="module")
def steering_webhook(tmp_path_factory):
    started = serving_webhooks(tmp_path_factory.mktemp("deep"))
    yield next(started)("--inventory", str(EXAMPLE_NODES), "--steer")
    next(started, None)


def _post(webhook, path: str, data: bytes) -> tuple[int, dict]:
    connection = webhook.connect()
    try:
        connection.request("POST", f"{path}?timeout=10s", body=data,
                           headers={"Host": f"{HOST}:{webhook.port}", "Content-Type": "application/json"})
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


CASES = [(path, kind, field) for path in ("/validate", "/mutate")
         for kind, fields in (("Job", FIELDS), ("Pod", {**SHOWN, **POD_FIELDS})) for field in fields]


@pytest.mark.parametrize("path,kind,field", CASES)
def test_a_deeply_nested_review_is_answered_or_a_400_naming_the_field(steering_webhook, caplog, path, kind, field):
    caplog.set_level(logging.WARNING, logger="image_preflight")
    build = {**FIELDS, **POD_FIELDS}[field]
    status, answer = _post(steering_webhook, path, body(build(kind), NEAR_THE_PARSER_LIMIT, field))
    if field in SHOWN:  # the log line shows it: answering it overflows
        assert status == 400, answer
    if status == 400:
        assert answer["error"].startswith(field) and f"nested more than {MAX_DEPTH} levels deep" in answer["error"]
    else:
        assert status == 200 and answer["response"]["uid"] == "u1", answer
        assert not any("internal error" in w for w in answer["response"].get("warnings", [])), answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
