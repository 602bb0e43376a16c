"""The node agent as the chart installs it: its DaemonSet's flags, mount and probe from its values,
pinning's needed list, and the NodeImages CRD, upgraded with the release and kept on uninstall."""

from __future__ import annotations

import yaml

from image_preflight.cli import parse_config
from image_preflight.core.image_gc.pinning import NEEDED_CONFIGMAP, NEEDED_NAME, NEEDED_NAMESPACE
from tests.chart import AGENT_NAMESPACE, CASES, CHART, render
from tests.deploy.rendered import _docs, _docs_with, _one


def test_pinning_adds_the_flag_and_reads_the_needed_list_only(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    documents = _docs("default")
    daemonset = _one(documents, "DaemonSet", "image-preflight-agent")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert args.pin_needed_images == NEEDED_CONFIGMAP and args.publish
    role = _one(documents, "Role", "image-preflight-agent-needed-images")
    assert role["metadata"]["namespace"] == NEEDED_NAMESPACE == AGENT_NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [NEEDED_NAME],
                              "verbs": ["get", "list", "watch"]}]
    binding = _one(documents, "RoleBinding", "image-preflight-agent-needed-images")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": daemonset["spec"]["template"]["spec"][
        "serviceAccountName"], "namespace": daemonset["metadata"]["namespace"]}]
    # The list is the trainer's: no install or upgrade may overwrite it.
    for case in CASES:
        assert not [d for d in _docs(case) if d["kind"] == "ConfigMap"], case
    without = _docs_with({"agent": {"pinning": {"enabled": False}}})
    (container,) = _one(without, "DaemonSet", "image-preflight-agent")["spec"]["template"]["spec"]["containers"]
    assert not parse_config([*container["command"][1:], *container["args"]]).pin_needed_images
    assert not [d for d in without if d["metadata"]["name"] == "image-preflight-agent-needed-images"]


def test_the_agents_values_become_its_flags_and_mount(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    documents = _docs("everything")
    pod = _one(documents, "DaemonSet", "image-preflight-agent")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert (args.interval, args.lease, args.sandbox_image) == (20.0, 120, "registry.k8s.io/pause:3.10.1")
    (volume,) = pod["volumes"]
    assert volume["hostPath"] == {"path": "/run/k3s/containerd/containerd.sock", "type": "Socket"}
    assert args.cri_endpoint == "unix://" + container["volumeMounts"][0]["mountPath"]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/rollouts": "true"}
    assert pod["priorityClassName"] == "system-node-critical"


def test_the_crd_is_a_template_upgraded_with_the_release_and_kept_on_uninstall():
    """As cert-manager's chart: crds.enabled renders it among the templates (so `helm upgrade`
    applies its newer rules; crds/ is installed once), crds.keep marks it for Helm to leave."""
    plain = yaml.safe_load((CHART / "files" / "nodeimages-crd.yaml").read_text(encoding="utf-8"))
    assert not (CHART / "crds").exists()
    crd = _one(render(hooks=False), "CustomResourceDefinition", plain["metadata"]["name"])
    assert crd["spec"] == plain["spec"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    unkept = _one(_docs_with({"crds": {"keep": False}}), "CustomResourceDefinition", plain["metadata"]["name"])
    assert "annotations" not in unkept["metadata"]
    assert not [d for d in _docs_with({"crds": {"enabled": False}}) if d["kind"] == "CustomResourceDefinition"]


def test_the_agent_is_probed_on_its_metrics_port_the_one_its_network_policy_opens(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    for values in ({}, {"agent": {"metricsPort": 9100}}):
        documents = _docs_with(values)
        (container,) = _one(documents, "DaemonSet", "image-preflight-agent")["spec"]["template"]["spec"]["containers"]
        port = parse_config([*container["command"][1:], *container["args"]]).metrics_port
        assert port == values.get("agent", {}).get("metricsPort", 9090)
        assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        policy = _one(documents, "NetworkPolicy", "image-preflight-agent")
        assert policy["spec"]["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
