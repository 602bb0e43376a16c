"""The watchdog as the chart installs it: it watches the namespaces the webhook checks, with the
flags its values give."""

from __future__ import annotations

import re

import pytest

from image_preflight.cli import parse_config
from image_preflight.core.doctor.findings import selects as selector_matches  # metav1.LabelSelector
from tests.chart import NAMESPACE
from tests.deploy.rendered import _docs, _one, _pod_spec, _webhook


@pytest.mark.parametrize("case", ["default", "everything"])
def test_the_watchdog_watches_the_namespaces_the_webhook_checks(case):
    """Its --namespace-selector is the webhook's namespaceSelector written as a label selector
    (k8s.io/apimachinery/pkg/labels): the same namespaces, the excluded ones left out too."""
    documents = _docs(case)
    deployment = _one(documents, "Deployment", "image-preflight-watchdog")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert type(args).__name__ == "WatchdogConfig"
    selector = _webhook(documents)["namespaceSelector"]
    samples = [{"kubernetes.io/metadata.name": name, **labels}
               for name in ("rollouts", "kube-system", "monitoring", NAMESPACE, "default")
               for labels in ({}, {"image-preflight.io/enforce": "true"}, {"image-preflight.io/enforce": "false"},
                              {"team": "rl", "image-preflight.io/enforce": "true"}, {"team": "rl"})]
    assert [label_selector_matches(args.namespace_selector, s) for s in samples] == [
        selector_matches(selector, s) for s in samples]
    binding = _one(documents, "ClusterRoleBinding", "image-preflight-watchdog")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"],
                                    "namespace": deployment["metadata"]["namespace"]}]
    assert container["securityContext"] == _pod_spec(documents)["containers"][0]["securityContext"]


def label_selector_matches(selector: str, labels: dict) -> bool:
    """k8s.io/apimachinery/pkg/labels Parse, for what the chart writes: `k=v`, `k in (..)`,
    `k notin (..)`, `k`, `!k`, joined by commas outside parentheses."""
    terms = re.findall(r"[^,(]+(?:\([^)]*\))?", selector)
    for term in (t.strip() for t in terms if t.strip()):
        if match := re.fullmatch(r"(\S+) (in|notin) \((.*)\)", term):
            key, operator, values = match[1], match[2], match[3].split(",")
            if (operator == "in") != (labels.get(key) in values if key in labels else False):
                if operator == "in" or key in labels:
                    return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "=" in term:
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


def test_the_watchdog_s_values_become_its_flags():
    documents = _docs("everything")
    (container,) = _one(documents, "Deployment", "image-preflight-watchdog")["spec"]["template"]["spec"]["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert (args.grace, args.mode, args.include_always) == (30.0, "audit", True)
    assert not [d for d in _docs("minimal") if "watchdog" in d["metadata"]["name"]]
