"""The chart's values: its schema describes every value of values.yaml and refuses a wrong one
naming it (Helm 3 and 4), and its README lists every value and no other."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.chart import CHART, template


@pytest.mark.parametrize(("values", "refused"), [
    ({"webhook": {"mode": "enforcing"}}, "webhook.mode"),
    ({"webhook": {"failurePolicy": "fail"}}, "webhook.failurePolicy"),
    ({"webhook": {"timeoutSeconds": 31}}, "webhook.timeoutSeconds"),
    ({"webhook": {"maxImages": -5}}, "webhook.maxImages"),
    ({"webhook": {"replicas": "two"}}, "webhook.replicas"),
    ({"webhook": {"steering": {"enable": True}}}, "webhook.steering"),
    ({"webhook": {"antiAffinity": "strict"}}, "webhook.antiAffinity"),
    ({"webhok": {"replicas": 2}}, "webhok"),
    ({"certificates": {"mode": "self-signed"}}, "certificates.mode"),
    ({"certificates": {"certManager": {"duration": "90d"}}}, "certificates.certManager.duration"),
    ({"agent": {"criSocket": "run/containerd.sock"}}, "agent.criSocket"),
    ({"agent": {"leaseSeconds": 0}}, "agent.leaseSeconds"),
    ({"agent": {"intervalSeconds": 0}}, "agent.intervalSeconds"),
    ({"watchdog": {"mode": "warn"}}, "watchdog.mode"),
    ({"watchdog": {"graceSeconds": -1}}, "watchdog.graceSeconds"),
    ({"securityContext": "restricted"}, "securityContext"),
    ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    ({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Equals"}]}},
     "namespaceSelector.matchExpressions"),
    ({"excludedNamespaces": ["Kube-System"]}, "excludedNamespaces"),
    ({"tests": {"namespace": "a_b"}}, "tests.namespace"),
])
@pytest.mark.parametrize("helm", ["helm", "helm4"])
def test_the_schema_refuses_a_wrong_value_naming_it(values, refused, helm):
    done = template(values, helm=helm, check=False)
    assert done.returncode != 0 and not done.stdout
    # Helm names the value by its JSON pointer (/webhook/mode) or its path (webhook.mode).
    named = (f"/{refused.replace('.', '/')}", refused)
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert any(name in done.stderr for name in named), done.stderr


def test_the_readme_lists_every_value_and_no_other():
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))

    def leaves(tree: dict, prefix: str = "") -> set[str]:
        found = set()
        for key, value in tree.items():
            path = f"{prefix}{key}"
            # Kubernetes structures and free maps are one value each.
            if isinstance(value, dict) and value and key not in OPAQUE_VALUES:
                found |= leaves(value, f"{path}.")
            else:
                found.add(path)
        return found

    readme = (CHART / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.]+)` \|", readme, re.M))
    assert listed == leaves(values)


# Values that are one Kubernetes structure or a free map, not a tree of values.
OPAQUE_VALUES = {"resources", "podSecurityContext", "securityContext", "matchLabels", "labels", "nodeSelector",
                 "affinity", "issuerRef"}


def test_the_schema_describes_every_value_the_chart_has():
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))

    def unknown(tree: dict, node: dict, path: str) -> list[str]:
        out = []
        for key, value in tree.items():
            child = (node.get("properties") or {}).get(key)
            if child is None:
                out.append(f"{path}{key}")
            elif isinstance(value, dict) and child.get("properties"):
                out += unknown(value, child, f"{path}{key}.")
        return out

    assert unknown(values, schema, "") == []
