"""What steering adds to a Pod's admission, in-process, interleaved in one run.

    .venv/bin/python benchmarks/steer_overhead.py [--number 20000] [--rounds 5]

The Pod of benchmarks/webhook_load.py's rollout Job (40 env vars, 5 KB), against three untainted
nodes of which one holds its image: the case steering exists for. Figures:
- the decision: core.admission.admit of the steered Pod (what /validate decides) against
  core.admission.mutation.steer of the Pod as created (decision, plan, JSONPatch and its base64);
- the endpoints: POST /validate against POST /mutate, each a whole ASGI call under uvloop
  (parse, answer, decision line and metrics included).
Each round times both the same number of times, alternating; the medians over rounds are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import statistics
import sys
import timeit
from pathlib import Path

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.webhook_breakdown import endpoint_seconds
from benchmarks.webhook_load import yaml_free_job
from image_preflight.core.admission.body import parse_review
from image_preflight.core.admission.mutation import steer
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.core.sources.snapshots import load_document
from image_preflight.webhook.app import WebhookState, create_app
from image_preflight.webhook.metrics import Metrics


def _inventory(image: str):
    nodes = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"cpu-{n}", "labels": {"pool": "cpu"}},
              "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                     "images": [{"names": ["docker.io/" + image] if n == "b" else ["x:1"],
                                                 "sizeBytes": 1}]}} for n in "abc"]
    return load_document({"apiVersion": "v1", "kind": "List", "items": nodes}, source="nodes")


def _pod_review(spec: dict) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "0b2c1e5e-0000-4000-8000-000000000002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "rl", "operation": "CREATE",
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "agl-rollout-1-", "namespace": "rl"},
                   "spec": spec}}}


def _patched(review: dict, patch: list[dict]) -> dict:
    pod = json.loads(json.dumps(review["request"]["object"]))
    for operation in patch:  # `add` only (core/admission/steering.py)
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        target = pod
        for key in parents:
            target = target[key]
        target[last] = operation["value"]
    return {**review, "request": {**review["request"], "object": pod}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    spec = yaml_free_job()["spec"]["template"]["spec"]
    inventory = _inventory(spec["containers"][0]["image"])
    settings = Settings(steer=True)
    created = _pod_review(spec)
    mutated = steer(created, inventory, settings, now=1.0)
    patch = json.loads(base64.b64decode(mutated.review["response"]["patch"]))
    steered = _patched(created, patch)
    assert admit(steered, inventory, settings, now=1.0).review["response"]["allowed"] is True

    sink = io.StringIO()
    state = WebhookState(inventory=lambda: inventory, ready=lambda: True, settings=settings, metrics=Metrics(),
                         write_decision=lambda line: sink.write(line + "\n"))
    app = create_app(state)
    bodies = {"/validate": orjson.dumps(steered), "/mutate": orjson.dumps(created)}

    parsed_created, parsed_steered = (parse_review(bodies[p], loads=orjson.loads) for p in ("/mutate", "/validate"))
    uvloop.install()
    decision, mutation, validate, mutate = [], [], [], []
    for _ in range(args.rounds):
        decision.append(timeit.timeit(lambda: admit(parsed_steered, inventory, settings, now=1.0),
                                      number=args.number) / args.number)
        mutation.append(timeit.timeit(lambda: steer(parsed_created, inventory, settings, now=1.0),
                                      number=args.number) / args.number)
        validate.append(asyncio.run(endpoint_seconds(app, "/validate", bodies["/validate"], args.number, sink)))
        mutate.append(asyncio.run(endpoint_seconds(app, "/mutate", bodies["/mutate"], args.number, sink)))
    for name, validating, mutating in (("decision (admit / steer)", decision, mutation),
                                       ("endpoint (/validate / /mutate)", validate, mutate)):
        v, m = statistics.median(validating) * 1e6, statistics.median(mutating) * 1e6
        print(f"| {name} | {v:.1f} µs | {m:.1f} µs | {m / v:.2f} |")
    print(f"patch: {len(patch)} operations, {len(mutated.review['response']['patch'])} bytes of base64")


if __name__ == "__main__":
    main()
