"""The HTTPS face: POST /validate for the apiserver, /healthz and /readyz for the kubelet."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from webhook.admission import BadReview, Outcome, Settings, admit, parse_review
from webhook.inventory import Inventory
from webhook.metrics import Metrics

MAX_BODY = 8 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0  # the apiserver's default timeoutSeconds
decision_log = logging.getLogger("image_preflight.decision")
log = logging.getLogger(__name__)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)$")


@dataclass
class WebhookState:
    inventory: Callable[[], Inventory]  # the current inventory
    ready: Callable[[], bool]  # synced and fresh
    settings: Settings
    metrics: Metrics


class _TooLarge(Exception):
    pass


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status)


def parse_timeout(value: str | None) -> float:
    """The apiserver's `?timeout=10s` (a Go duration); unreadable means the default."""
    match = _DURATION.match(value or "")
    if not match:
        return DEFAULT_TIMEOUT
    number, unit = float(match.group(1)), match.group(2)
    return number / 1000 if unit == "ms" else number * 60 if unit == "m" else number


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(state: WebhookState) -> FastAPI:
    app = FastAPI(title="image-preflight", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/validate")
    async def validate(request: Request) -> Response:
        started = time.perf_counter()
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return _error(400, f"content type {content_type or 'none'!r} is not application/json")
        # Answer well inside the apiserver's deadline; past it nobody is listening.
        budget = parse_timeout(request.query_params.get("timeout")) * 0.9
        try:
            body = await asyncio.wait_for(_read_body(request), timeout=budget)
        except _TooLarge:
            return _error(413, f"body larger than {MAX_BODY} bytes")
        except asyncio.TimeoutError:
            return _error(408, "body not received before the request's timeout")
        try:
            review = parse_review(body)
        except BadReview as exc:
            return _error(400, str(exc))
        try:
            outcome = admit(review, state.inventory(), state.settings, now=time.time())
        except Exception as exc:  # never a 500: the apiserver would apply failurePolicy blindly
            log.exception("decision failed for uid %s", review["request"]["uid"])
            outcome = _internal_error(review, exc)
        elapsed = time.perf_counter() - started
        _record(state.metrics, outcome, elapsed)
        return Response(json.dumps(outcome.review, separators=(",", ":")), media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if state.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "inventory not synced or stale"}, status_code=503)

    return app


def _internal_error(review: dict, exc: Exception) -> Outcome:
    request = review["request"]
    response = {
        "uid": request["uid"],
        "allowed": True,
        "warnings": [f"image-preflight: internal error, not checked ({type(exc).__name__})"],
    }
    return Outcome(
        review={"apiVersion": review["apiVersion"], "kind": review["kind"], "response": response},
        decision="error",
        uid=request["uid"],
        operation=str(request.get("operation", "")),
        detail=str(exc),
    )


def _record(metrics: Metrics, outcome: Outcome, elapsed: float) -> None:
    metrics.requests.labels(outcome.kind or "-", outcome.operation or "-", outcome.decision).inc()
    metrics.latency.observe(elapsed)
    record = outcome.log_record()
    record["latency_ms"] = round(elapsed * 1000, 3)
    decision_log.info(json.dumps(record, separators=(",", ":")))
