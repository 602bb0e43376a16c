"""What each face may do as the chart installs it: the webhook's ClusterRole only reads, the
Deployments are hardened, and the agent and the watchdog write only under their
ValidatingAdmissionPolicies, the watchdog's not to be turned off while it runs. Their effect on
the real apiserver: tests/cluster/test_cluster_agent_policy.py, tests/cluster/test_cluster_policies.py."""

from __future__ import annotations

import pytest
import yaml

from image_preflight.cli import parse_config
from tests.chart import AGENT_NAMESPACE, NAMESPACE, template
from tests.deploy.rendered import _docs, _docs_with, _one, _pod_spec


def test_cluster_role_only_reads_nodes_node_images_and_runtime_classes():
    documents = _docs("default")
    rules = _one(documents, "ClusterRole", "image-preflight")["rules"]
    granted = {(group, resource): set(rule["verbs"])
               for rule in rules for group in rule["apiGroups"] for resource in rule["resources"]}
    assert granted == {("", "nodes"): {"list", "watch"}, ("image-preflight.io", "nodeimages"): {"list", "watch"},
                       ("node.k8s.io", "runtimeclasses"): {"list", "watch"}}
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in rules)
    binding = _one(documents, "ClusterRoleBinding", "image-preflight")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "image-preflight"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "image-preflight", "namespace": NAMESPACE}]
    assert _pod_spec(documents)["serviceAccountName"] == "image-preflight"


@pytest.mark.parametrize("name", ["image-preflight", "image-preflight-watchdog"])
def test_deployments_are_hardened(name):
    spec = _one(_docs("default"), "Deployment", name)["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] > 0
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    for bound in ("requests", "limits"):
        assert set(container["resources"][bound]) == {"cpu", "memory"}
    assert spec["automountServiceAccountToken"] is True  # in-cluster credentials for the watch


def test_the_node_restriction_policy_binds_the_agents_writes_to_their_nodes():
    """kubernetes pkg/registry/core/serviceaccount/storage/token.go (TokenREST.Create) puts the
    Pod's node in a pod-bound token, and k8s.io/apiserver pkg/authentication/serviceaccount/util.go
    (NodeNameKey) in the requester's extra: the policy compares it with the object's name. Its
    effect on the real apiserver: tests/cluster/test_real_node_chart.py."""
    documents = _docs("default")
    policy = _one(documents, "ValidatingAdmissionPolicy", "image-preflight-agent-own-node")
    lists, leases = policy["spec"]["matchConstraints"]["resourceRules"]
    assert lists == {"apiGroups": ["image-preflight.io"], "apiVersions": ["*"], "resources": ["nodeimages"],
                     "operations": ["CREATE", "UPDATE", "DELETE"]}
    # The Lease that renews a hashed list, held to the node by its name and spec.holderIdentity.
    assert leases == {"apiGroups": ["coordination.k8s.io"], "apiVersions": ["*"], "resources": ["leases"],
                      "operations": ["CREATE", "UPDATE", "DELETE"]}
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f"request.userInfo.username == \"system:serviceaccount:{AGENT_NAMESPACE}:image-preflight-agent\"")
    assert "authentication.kubernetes.io/node-name" in policy["spec"]["variables"][0]["expression"]
    # A Pod-bound token only, and spec.nodeName checked too (a DELETE's from oldObject): its effect
    # on the real apiserver, tests/cluster/test_cluster_agent_policy.py.
    variables = " ".join(v["expression"] for v in policy["spec"]["variables"])
    assert "authentication.kubernetes.io/pod-name" in variables and "oldObject" in variables
    assert "spec.nodeName" in variables and "spec.holderIdentity" in variables
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = _one(documents, "ValidatingAdmissionPolicyBinding", "image-preflight-agent-own-node")
    assert binding["spec"] == {"policyName": "image-preflight-agent-own-node", "validationActions": ["Deny"]}
    off = _docs_with({"agent": {"nodeRestriction": {"enabled": False}}})
    assert not [d for d in off
                if d["kind"].startswith("ValidatingAdmissionPolicy") and "own-node" in d["metadata"]["name"]]


@pytest.mark.parametrize("helm", ["helm", "helm4"])
def test_the_watchdogs_write_policy_cannot_be_turned_off_while_the_watchdog_runs(helm):
    """Its ClusterRole patches Jobs and creates Pods cluster-wide: without the policy a stolen token
    reaches every namespace (Pods in kube-system)."""
    done = template({"watchdog": {"writeRestriction": {"enabled": False}}}, helm=helm, check=False)
    assert done.returncode != 0 and not done.stdout
    # One line says it (Helm 3 adds its hint about --debug below).
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("Error:")]
    assert line.endswith("watchdog.writeRestriction.enabled=false would leave the watchdog's cluster-wide Job patch "
                         "and Pod create unguarded: keep it true, or set watchdog.enabled=false"), done.stderr
    off = template({"watchdog": {"enabled": False, "writeRestriction": {"enabled": False}}}, helm=helm)
    assert not [d for d in yaml.safe_load_all(off.stdout) if d and "watchdog" in d["metadata"]["name"]]


def test_the_agent_and_the_watchdog_start_only_under_their_write_policies_which_they_may_read_by_name(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the DaemonSet's, from spec.nodeName
    for restricted in (True, False):
        documents = _docs_with({"agent": {"nodeRestriction": {"enabled": restricted}}})
        faces = {("DaemonSet", "image-preflight-agent"): "image-preflight-agent-own-node",
                 ("Deployment", "image-preflight-watchdog"): "image-preflight-watchdog-writes"}
        for (kind, name), policy in faces.items():
            (container,) = _one(documents, kind, name)["spec"]["template"]["spec"]["containers"]
            args = parse_config([*container["command"][1:], *container["args"]])
            guarded = restricted or name == "image-preflight-watchdog"
            assert args.write_policy == (policy if guarded else None), (name, restricted)
            assert {d["kind"] for d in documents if d["metadata"]["name"] == policy} == (
                {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} if guarded else set())
            reads = [r for r in _one(documents, "ClusterRole", name)["rules"]
                     if r["apiGroups"] == ["admissionregistration.k8s.io"]]
            assert reads == ([{"apiGroups": ["admissionregistration.k8s.io"],
                               "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
                               "resourceNames": [policy], "verbs": ["get"]}] if guarded else []), (name, restricted)
