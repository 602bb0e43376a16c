"""The chart as the tests of tests/deploy/ read it: a ci/ case's objects, or the defaults with some
values layered on, each rendered once a session (tests.chart.template), and the objects the tests
look up in them. Underscored: they are helpers of this folder's tests alone, where tests/chart.py
serves every folder."""

from __future__ import annotations

import functools
import json

import yaml
from kubernetes_validate.utils import latest_version

from tests.chart import template

WEBHOOK = "validate.image-preflight.io"
K8S_VERSION = latest_version()


@functools.cache
def _rendered(case: str) -> tuple[str, list[dict]]:
    """`helm template` of a ci/ case, the CRD included: its text and its objects."""
    text = template(case=case).stdout
    return text, [d for d in yaml.safe_load_all(text) if d]


def _docs(case: str) -> list[dict]:
    return _rendered(case)[1]


@functools.cache
def _with(values_json: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(template(json.loads(values_json)).stdout) if d]


def _docs_with(values: dict) -> list[dict]:
    """The chart's defaults with `values` layered on, rendered once a session."""
    return _with(json.dumps(values, sort_keys=True))


def _one(documents: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _webhook(documents: list[dict]) -> dict:
    configuration = _one(documents, "ValidatingWebhookConfiguration", "image-preflight")
    (hook,) = [h for h in configuration["webhooks"] if h["name"] == WEBHOOK]
    return hook


def _pod_spec(documents: list[dict]) -> dict:
    return _one(documents, "Deployment", "image-preflight")["spec"]["template"]["spec"]
