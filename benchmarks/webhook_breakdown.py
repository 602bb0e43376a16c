"""Where a review's time goes inside `serve`, in-process and without the network.

    python benchmarks/webhook_breakdown.py [--number 20000]

The review of benchmarks/webhook_load.py (a 5.2 KB rollout Job) against the example inventory,
and with a nodeSelector and a toleration against its five nodes of 1,253 images: orjson's parse,
the decision (admit), the answer's encode, and the whole /validate endpoint as an ASGI call under
uvloop (decision line and metrics included, the line written to a buffer).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import tempfile
import timeit
from pathlib import Path

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.webhook_load import EXAMPLE_NODES, multi_node_inventory, review_body, scheduled_review_body
from image_preflight.core.admission.body import parse_review
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.files.inventory import DEFAULT_MAX_IMAGES, load_inventory_file
from image_preflight.webhook.app import WebhookState, _dumps, create_app
from image_preflight.webhook.metrics import Metrics


async def endpoint_seconds(app, path: str, body: bytes, n: int, sink: io.StringIO) -> float:
    """Seconds per call of the ASGI `app` at POST `path` with `body`, the decision lines dropped."""
    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"timeout=10s",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(_message):
        return None

    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(n):
        await app(scope, receive, send)
        sink.seek(0)
        sink.truncate()
    return (loop.time() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()
    uvloop.install()
    with tempfile.TemporaryDirectory() as tmp:
        images = multi_node_inventory(Path(tmp) / "nodes.json")
        cases = (("the example", EXAMPLE_NODES, review_body(), DEFAULT_MAX_IMAGES),
                 (f"5 nodes, {images:,} images, nodeSelector and toleration", Path(tmp) / "nodes.json",
                  scheduled_review_body(), -1))
        for label, path, body, max_images in cases:
            inventory = load_inventory_file(path, max_images=max_images)
            print(f"{label}:")
            breakdown(inventory, body, args.number)


def breakdown(inventory, body: bytes, number: int) -> None:
    review = parse_review(body, loads=orjson.loads)
    settings = Settings()  # as serve: built once
    answer = admit(review, inventory, settings, now=1.0)
    sink = io.StringIO()
    state = WebhookState(inventory=lambda: inventory, ready=lambda: True, settings=settings, metrics=Metrics(),
                         write_decision=lambda line: sink.write(line + "\n"))
    app = create_app(state)

    for name, call in (("parse (orjson)", lambda: orjson.loads(body)),
                       ("decision (admit)", lambda: admit(review, inventory, settings, now=1.0)),
                       ("encode the answer", lambda: _dumps(answer.review))):
        print(f"  {name:28s} {timeit.timeit(call, number=number) / number * 1e6:7.2f} µs")
    asyncio.run(endpoint_seconds(app, "/validate", body, 1000, sink))
    seconds = asyncio.run(endpoint_seconds(app, "/validate", body, number, sink))
    print(f"  {'whole /validate endpoint':28s} {seconds * 1e6:7.2f} µs")

if __name__ == "__main__":
    main()
