"""The chart's webhook callers: `webhook.tls.clientNames` becomes `serve --client-name`, only with the
client CA it is checked against."""

from __future__ import annotations

from pathlib import Path

import pytest

from image_preflight.cli import parse_config
from tests.chart import render, template

CLIENT_CA = {"clientCASecret": "apiserver-client-ca"}


def _serve_config(values: dict):
    (deployment,) = [d for d in render(values)
                     if d["kind"] == "Deployment" and d["metadata"]["name"] == "image-preflight"]
    return parse_config(["serve", *deployment["spec"]["template"]["spec"]["containers"][0]["args"]])


def test_the_webhooks_client_names_become_its_client_name_flags_beside_the_client_ca():
    names = ["kube-apiserver-webhook-client", "system:apiserver with: colon"]
    config = _serve_config({"webhook": {"tls": {**CLIENT_CA, "clientNames": names}}})
    assert config.client_names == frozenset(names)
    assert config.client_ca == Path("/etc/image-preflight/client-ca/ca.crt")
    assert _serve_config({"webhook": {"tls": CLIENT_CA}}).client_names == frozenset()


def test_webhook_client_names_without_the_client_ca_fail_the_render_naming_both():
    done = template({"webhook": {"tls": {"clientNames": ["kube-apiserver"]}}}, check=False)
    assert done.returncode != 0 and not done.stdout
    assert "webhook.tls.clientNames needs webhook.tls.clientCASecret" in done.stderr, done.stderr


@pytest.mark.parametrize("names", [[""], ["a", "a"], "kube-apiserver"])
def test_the_schema_refuses_webhook_client_names_that_name_nothing_twice_or_are_not_a_list(names):
    done = template({"webhook": {"tls": {**CLIENT_CA, "clientNames": names}}}, check=False)
    assert done.returncode != 0 and not done.stdout
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert any(name in done.stderr for name in ("/webhook/tls/clientNames", "webhook.tls.clientNames")), done.stderr
