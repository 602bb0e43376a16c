"""The webhook as the chart installs it, as its README and docs/deploy.md promise: a configuration
that fails open, sees Jobs and Pods, checks opted-in namespaces only and reaches `serve` through
the Service; a Deployment of two spread replicas of this version, with the flags its values give;
and what the values that change the configuration (agentlightningOnly, failurePolicy, steering)
change."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from image_preflight.cli import parse_config
from image_preflight.core.doctor.findings import selects as selector_matches  # metav1.LabelSelector
from tests.builders.reviews import EXAMPLES
from tests.chart import CHART, NAMESPACE, SERVICE, template
from tests.deploy.rendered import _docs, _docs_with, _one, _pod_spec, _webhook
from tests.release import ROOT


def test_webhook_fails_open_quickly_without_side_effects():
    hook = _webhook(_docs("default"))
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 5
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert "objectSelector" not in hook and "matchConditions" not in hook


def test_webhook_sees_jobs_and_pods_on_create_and_update():
    rules = {
        (tuple(r["apiGroups"]), tuple(r["apiVersions"]), tuple(r["resources"])): set(r["operations"])
        for r in _webhook(_docs("default"))["rules"]
    }
    assert rules == {(("batch",), ("v1",), ("jobs",)): {"CREATE", "UPDATE"},
                     (("",), ("v1",), ("pods",)): {"CREATE", "UPDATE"}}


def test_webhook_reaches_the_server_through_the_service():
    documents = _docs("default")
    service_ref = _webhook(documents)["clientConfig"]["service"]
    assert service_ref == {"name": SERVICE, "namespace": NAMESPACE, "path": "/validate", "port": 443}
    service = _one(documents, "Service", SERVICE)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == 443]
    container = _pod_spec(documents)["containers"][0]
    by_name = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert by_name[port["targetPort"]] == 8443
    assert selector_matches({"matchLabels": service["spec"]["selector"]},
                            _one(documents, "Deployment", SERVICE)["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize(
    ("labels", "enforced"),
    [
        ({"kubernetes.io/metadata.name": "default"}, False),
        ({"kubernetes.io/metadata.name": "rollouts", "image-preflight.io/enforce": "true"}, True),
        ({"kubernetes.io/metadata.name": "rollouts", "image-preflight.io/enforce": "false"}, False),
        ({"kubernetes.io/metadata.name": "kube-system", "image-preflight.io/enforce": "true"}, False),
        ({"kubernetes.io/metadata.name": NAMESPACE, "image-preflight.io/enforce": "true"}, False),
    ],
)
def test_enforcement_is_opt_in_and_spares_system_namespaces(labels, enforced):
    assert selector_matches(_webhook(_docs("default"))["namespaceSelector"], labels) is enforced


def test_the_release_namespace_is_spared_wherever_the_chart_is_installed():
    documents = [d for d in yaml.safe_load_all(template(namespace="preflight").stdout) if d]
    selector = _webhook(documents)["namespaceSelector"]
    assert not selector_matches(selector, {"kubernetes.io/metadata.name": "preflight",
                                           "image-preflight.io/enforce": "true"})
    assert selector_matches(selector, {"kubernetes.io/metadata.name": NAMESPACE, "image-preflight.io/enforce": "true"})


def test_deployment_runs_two_spread_replicas_of_this_version():
    documents = _docs("default")
    deployment = _one(documents, "Deployment", SERVICE)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    spec = deployment["spec"]["template"]["spec"]
    (spread,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = spread["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname" and term["matchLabelKeys"] == ["pod-template-hash"]
    assert selector_matches(term["labelSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == chart["version"] == project
    container = spec["containers"][0]
    assert container["image"] == f"image-preflight:{project}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    probes = {name: container[name]["httpGet"] for name in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
    assert {p["scheme"] for p in probes.values()} == {"HTTPS"}
    budget = _one(documents, "PodDisruptionBudget", SERVICE)
    assert budget["spec"]["minAvailable"] == 1
    assert selector_matches(budget["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])


def test_hard_anti_affinity_requires_other_nodes_and_none_spreads_nothing():
    documents = _docs_with({"webhook": {"antiAffinity": "hard"}, "watchdog": {"antiAffinity": "none"}})
    (term,) = _pod_spec(documents)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert "affinity" not in _one(documents, "Deployment", "image-preflight-watchdog")["spec"]["template"]["spec"]
    given = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    assert _pod_spec(_docs_with({"webhook": {"affinity": given}}))["affinity"] == given


def test_the_client_ca_comes_from_the_named_secret_and_only_ca_crt():
    spec = _pod_spec(_docs_with({"webhook": {"tls": {"clientCASecret": "apiserver-client-ca"}}}))
    (volume,) = [v for v in spec["volumes"] if v["name"] == "client-ca"]
    assert volume["secret"] == {"secretName": "apiserver-client-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "client-ca"]
    assert mount == {"name": "client-ca", "mountPath": "/etc/image-preflight/client-ca", "readOnly": True}
    assert not [v for v in _pod_spec(_docs("default"))["volumes"] if v["name"] == "client-ca"]


def test_the_apiservers_service_carries_https_only_and_metrics_have_their_own():
    documents = _docs("everything")
    assert [p["name"] for p in _one(documents, "Service", SERVICE)["spec"]["ports"]] == ["https"]
    metrics = _one(documents, "Service", f"{SERVICE}-metrics")
    assert [(p["name"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [("metrics", "metrics")]
    (monitor,) = [d for d in documents if d["kind"] == "ServiceMonitor"]
    assert selector_matches(monitor["spec"]["selector"], metrics["metadata"]["labels"])
    assert not selector_matches(monitor["spec"]["selector"], _one(documents, "Service", SERVICE)["metadata"]["labels"])


def test_the_network_policy_admits_the_sources_given_for_each_port():
    apiserver = [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    scraper = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    policy = _one(_docs_with({"webhook": {"networkPolicy": {"from": apiserver, "metricsFrom": scraper}}}),
                  "NetworkPolicy", SERVICE)
    assert [(rule["ports"][0]["port"], rule["from"]) for rule in policy["spec"]["ingress"]] == [
        ("https", apiserver), ("metrics", scraper)]
    default = _one(_docs("default"), "NetworkPolicy", SERVICE)
    assert [(rule["ports"][0]["port"], "from" in rule) for rule in default["spec"]["ingress"]] == [
        ("https", False), ("metrics", False)]


def test_deployment_arguments_are_valid_serve_flags_reading_the_mounted_secret():
    spec = _pod_spec(_docs("default"))
    container = spec["containers"][0]
    args = parse_config(["serve", *container["args"]])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
    assert args.tls_cert == Path(mount["mountPath"]) / "tls.crt"
    assert args.tls_key == Path(mount["mountPath"]) / "tls.key"
    assert (args.port, args.mode, args.unknown, args.max_images, args.steer) == (8443, "enforce", "allow", 50, False)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == f"{SERVICE}-tls"  # `image-preflight certs --secret`'s name
    # The CA's key is in the Secret only in mode secret (the user's own); the Pod never mounts it.
    assert {item["key"] for item in volume["secret"]["items"]} == {"tls.crt", "tls.key"}


@pytest.mark.parametrize(("values", "flags"), [
    ({"webhook": {"mode": "warn", "unknown": "deny", "require": "any", "maxImages": -1, "logLevel": "debug"}},
     {"mode": "warn", "unknown": "deny", "require": "any", "max_images": -1, "log_level": "debug"}),
    ({"webhook": {"steering": {"enabled": True, "maxNodes": 7}, "extraArgs": ["--max-inventory-age=60"]}},
     {"steer": True, "steer_max_nodes": 7, "max_inventory_age": 60.0}),
    ({}, {"tls_min_version": "1.3", "client_ca": None}),
    ({"webhook": {"tls": {"minVersion": "1.2", "clientCASecret": "apiserver-client-ca"}}},
     {"tls_min_version": "1.2", "client_ca": Path("/etc/image-preflight/client-ca/ca.crt")}),
])
def test_the_webhooks_values_become_its_flags(values, flags):
    args = parse_config(["serve", *_pod_spec(_docs_with(values))["containers"][0]["args"]])
    assert {name: getattr(args, name) for name in flags} == flags


def _differences_from_defaults(documents: list[dict]) -> dict:
    base, changed = _webhook(_docs("default")), _webhook(documents)
    return {k: changed.get(k) for k in set(base) | set(changed)
            if k != "clientConfig" and base.get(k) != changed.get(k)}


def test_agentlightning_only_matches_agentlightnings_jobs_and_their_pods():
    """build_job_spec labels the Job, not its Pods (the real template labels them app: agl-rollout
    only), so the condition matches Jobs by label and Pods by the job-name label the apiserver adds
    to every Job's template. Its behaviour is proved on a real control plane in
    tests/cluster/test_cluster_agentlightning.py; here, its shape."""
    documents = _docs_with({"agentlightningOnly": True})
    differences = _differences_from_defaults(documents)
    assert set(differences) == {"matchConditions"}  # the rules and namespaceSelector stay the defaults'
    (condition,) = differences["matchConditions"]
    expression = " ".join(condition["expression"].split())
    assert expression.startswith("[object, oldObject].exists(o, o != null && has(o.metadata.labels) && (")
    assert ("'app.kubernetes.io/managed-by' in o.metadata.labels && "
            "o.metadata.labels['app.kubernetes.io/managed-by'] == 'agentlightning'") in expression
    assert ("'batch.kubernetes.io/job-name' in o.metadata.labels && "
            "o.metadata.labels['batch.kubernetes.io/job-name'].startsWith('agl-rollout-')") in expression
    job = yaml.safe_load((EXAMPLES / "missing-image-job.yaml").read_text(encoding="utf-8"))
    assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "agentlightning"
    assert job["metadata"]["name"].startswith("agl-rollout-")
    assert job["spec"]["template"]["metadata"]["labels"] == {"app": "agl-rollout"}


def test_failure_policy_fail_changes_only_the_policy():
    assert _differences_from_defaults(_docs_with({"webhook": {"failurePolicy": "Fail"}})) == {"failurePolicy": "Fail"}


def test_steering_sends_pod_creates_to_mutate_like_the_validating_webhook():
    for only in (False, True):
        documents = _docs_with({"webhook": {"steering": {"enabled": True}}, "agentlightningOnly": only})
        (hook,) = _one(documents, "MutatingWebhookConfiguration", "image-preflight")["webhooks"]
        validating = _webhook(documents)
        assert hook["clientConfig"] == {**validating["clientConfig"],
                                        "service": {**validating["clientConfig"]["service"], "path": "/mutate"}}
        assert hook["namespaceSelector"] == validating["namespaceSelector"]
        # The same match conditions: agentlightningOnly steers only what it checks.
        assert hook.get("matchConditions") == validating.get("matchConditions")
        assert (hook["failurePolicy"], hook["sideEffects"], hook["reinvocationPolicy"]) == (
            "Ignore", "None", "IfNeeded")
        assert hook["timeoutSeconds"] <= 3
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                  "operations": ["CREATE"], "scope": "Namespaced"}]
        args = parse_config(["serve", *_pod_spec(documents)["containers"][0]["args"]])
        assert args.steer
        roles = [d for d in documents if d["kind"] in ("ClusterRole", "Role")]
        assert roles == [d for d in _docs("default") if d["kind"] in ("ClusterRole", "Role")]  # RBAC unchanged
    assert not [d for d in _docs("default") if d["kind"] == "MutatingWebhookConfiguration"]
