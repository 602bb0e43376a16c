"""The chart's hooks: `helm test` runs doctor against an opted-in namespace of its own, with an
account that writes only dry runs; the uninstall hook deletes the NodeImages with a role of its
own, and every object of it goes whether it succeeds or fails."""

from __future__ import annotations

from image_preflight.cli import build_parser, parse_config
from image_preflight.core.doctor.findings import selects as selector_matches  # metav1.LabelSelector
from tests.chart import NAMESPACE
from tests.deploy.rendered import _docs, _docs_with, _one, _webhook


def test_helm_test_runs_doctor_against_an_opted_in_namespace_of_its_own():
    documents = _docs("default")
    (pod,) = [d for d in documents if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    args = parse_config([*container["command"][1:], *container["args"]])
    assert type(args).__name__ == "DoctorConfig" and args.namespace == "image-preflight-test"
    # The Service's address from its environment: a test Pod needs no cluster DNS.
    assert args.webhook_address == "$(IMAGE_PREFLIGHT_SERVICE_HOST):$(IMAGE_PREFLIGHT_SERVICE_PORT_HTTPS)"
    assert pod["spec"]["enableServiceLinks"] is True
    namespace = _one(documents, "Namespace", "image-preflight-test")
    assert selector_matches(_webhook(documents)["namespaceSelector"],
                            {**namespace["metadata"]["labels"], "kubernetes.io/metadata.name": "image-preflight-test"})
    # Helm 3's `helm test --logs` reads every test hook as a Pod: the Pod is the only one.
    assert [d["kind"] for d in documents
            if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"] == ["Pod"]
    assert not [d for d in _docs("minimal") if "image-preflight-test" in d["metadata"]["name"]]


def test_the_uninstall_hook_deletes_node_images_with_a_role_of_its_own():
    documents = _docs("default")
    hooks = [d for d in documents if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "post-delete"]
    assert sorted(d["kind"] for d in hooks) == [
        "ClusterRole", "ClusterRoleBinding", "Job", "NetworkPolicy", "ServiceAccount"]
    (job,) = [d for d in hooks if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = build_parser()[0].parse_args([*container["command"][1:], *container["args"]])
    assert (args.command, args.action) == ("inventory", "delete")
    (role,) = [d for d in hooks if d["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": ["image-preflight.io"], "resources": ["nodeimages"], "verbs": ["list", "delete"]}]
    # Roles first, the Job last; each gone once it succeeded.
    weights = {d["kind"]: int(d["metadata"]["annotations"].get("helm.sh/hook-weight", "0")) for d in hooks}
    assert max(weights[k] for k in ("ClusterRole", "ClusterRoleBinding", "NetworkPolicy", "ServiceAccount")) \
        < weights["Job"]
    assert {d["metadata"]["annotations"]["helm.sh/hook-delete-policy"] for d in hooks} == {
        "before-hook-creation,hook-succeeded,hook-failed"}


def test_every_object_of_the_uninstall_hook_goes_whether_it_succeeds_or_fails():
    """Helm's hook-delete-policy values (pkg/action/hooks.go): before-hook-creation, hook-succeeded,
    hook-failed. A failed hook's Job goes by hook-failed, the objects run before it by
    hook-succeeded; tests/cluster/test_cluster_agent_policy.py fails one for real."""
    for case in ("default", "minimal"):
        hooks = [d for d in _docs(case)
                 if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "post-delete"]
        assert hooks
        for hook in hooks:
            policies = hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")
            assert sorted(policies) == ["before-hook-creation", "hook-failed", "hook-succeeded"], hook["kind"]


def test_the_helm_test_account_writes_only_dry_runs():
    """Its Role lets it create Jobs, for doctor's dry-run rollout Job: a policy refuses every write
    of it that is not a dry run. An ordinary object of the release, like the account, so it is in
    force before `helm test` and goes at uninstall; the test Pod stays the only test hook."""
    documents = _docs("default")
    policy = _one(documents, "ValidatingAdmissionPolicy", "image-preflight-test-dry-runs-only")
    assert "helm.sh/hook" not in (policy["metadata"].get("annotations") or {})
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["*"], ["*/*"])
    assert {"CREATE", "UPDATE", "DELETE"} <= set(rule["operations"])
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:image-preflight-test"')
    assert [v["expression"] for v in policy["spec"]["validations"]] == ["request.dryRun == true"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = _one(documents, "ValidatingAdmissionPolicyBinding", "image-preflight-test-dry-runs-only")
    assert binding["spec"] == {"policyName": "image-preflight-test-dry-runs-only", "validationActions": ["Deny"]}
    assert not [d for d in _docs_with({"tests": {"enabled": False}}) if "image-preflight-test" in d["metadata"]["name"]]
