"""What the chart lets its own accounts write, on the real apiserver: the chart published to a
registry as its README says (tests/oci_registry.py) and installed from there by `helm install
oci://...` on a control plane of this module's own (its node restriction refuses the agents of the
other modules, whose tokens are bound to no Pod), then uninstalled with a hook that fails.

- The node agent writes NodeImages only with a token bound to its Pod on a node, and only its
  node's: named after it and with it as spec.nodeName. A token bound to a Node object carries the
  node too (kubernetes pkg/registry/core/serviceaccount/storage/token.go, TokenREST.Create) and
  may be had by whoever may create serviceaccounts/token in the agent's namespace; it writes
  nothing. The CRD's own rule tying the name to spec.nodeName is taken out here, as a CRD Helm
  never upgraded may lack it, so that the policy alone is tried.
- The `helm test` ServiceAccount writes only dry runs.
- A failing `helm uninstall` hook leaves none of its objects behind, its role to delete NodeImages
  least of all.

No kubelet runs here: the agent's Pod is bound to its node by spec.nodeName and never starts, and
the uninstall hook's Job never completes, so Helm gives up on it at --timeout, as on a hook that
failed."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from image_preflight.agent.inventory import CREATE, RENEW
from image_preflight.agent.publisher import Publisher
from image_preflight.core.sources.runtime_lists import (
    GROUP,
    LEASE_GROUP,
    LEASE_PLURAL,
    LEASE_VERSION,
    PLURAL,
    VERSION,
    format_time,
    lease_object,
)
from tests.agent_helpers import SAMPLE, T0
from tests.chart import AGENT_NAMESPACE, API_ONLY, NAMESPACE, RELEASE, helm_binary
from tests.controlplane.cluster import (
    ControlPlane,
    create_node,
    kubeconfig_document,
    running_control_plane,
    wait_for,
    write_kubeconfig,
)
from tests.oci_registry import Registry, publish_as_readme
from tests.release import VERSION as RELEASED

NODE_A, NODE_B = "node-a", "node-b"
AGENT = "image-preflight-agent"
TEST_ACCOUNT = TEST_NAMESPACE = "image-preflight-test"
UNINSTALL = "image-preflight-uninstall"
CRD = "nodeimages.image-preflight.io"
NODEIMAGES = (GROUP, VERSION, PLURAL)
NO_POD = "image-preflight-agent may write NodeImages only with a token bound to a Pod on a node"
# The agents' DaemonSet on no node of this cluster: the test binds a Pod of the agent's account itself.
VALUES = {"agent": API_ONLY["agent"] | {"nodeRestriction": {"enabled": True}}}


@dataclass
class Install:
    plane: ControlPlane
    folder: Path
    agent_pod: k8s.V1Pod | None = None  # of the agent's account, on NODE_A, once installed

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([helm_binary(), *args, "--namespace", NAMESPACE,
                               "--kubeconfig", str(self.plane.kubeconfig)],
                              capture_output=True, text=True, check=False, timeout=300,
                              env={**os.environ, "HOME": str(self.folder)})
        if check:
            assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
        return done

    @property
    def admin(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.plane.api_client())

    def token(self, namespace: str, account: str, bound: k8s.V1BoundObjectReference | None = None) -> k8s.ApiClient:
        """An API client acting as the ServiceAccount with a token from the TokenRequest API, bound to `bound`."""
        spec = k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600, bound_object_ref=bound)
        token = self.plane.core().create_namespaced_service_account_token(
            account, namespace, k8s.AuthenticationV1TokenRequest(spec=spec)).status.token
        path = self.folder / f"{account}-{os.urandom(4).hex()}.kubeconfig"
        document = kubeconfig_document(self.plane.url, self.plane.ca.cert_path, {"token": token})
        return self.plane.api_client(write_kubeconfig(path, document))

    def agent_bound_to_its_pod(self) -> k8s.ApiClient:
        pod = self.agent_pod
        assert pod is not None
        return self.token(AGENT_NAMESPACE, AGENT, k8s.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid))

    def agent_bound_to_node(self, name: str) -> k8s.ApiClient:
        node = self.plane.core().read_node(name)
        return self.token(AGENT_NAMESPACE, AGENT, k8s.V1BoundObjectReference(
            api_version="v1", kind="Node", name=name, uid=node.metadata.uid))

    def stored(self, name: str) -> dict | None:
        try:
            return self.admin.get_cluster_custom_object(*NODEIMAGES, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete_lists(self) -> None:
        for name in (NODE_A, NODE_B):
            if self.stored(name) is not None:
                self.admin.delete_cluster_custom_object(*NODEIMAGES, name)
            try:
                k8s.CoordinationV1Api(self.plane.api_client()).delete_namespaced_lease(name, AGENT_NAMESPACE)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def node_images(name: str, node: str | None = None) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeImages", "metadata": {"name": name},
            "spec": {"nodeName": node or name, "observedAt": "2027-01-15T08:00:00Z", "leaseDurationSeconds": 300,
                     "images": []}}


def message(error: ApiException) -> str:
    """The apiserver's Status message of a refused request."""
    try:
        return json.loads(error.body or "{}").get("message", "")
    except ValueError:
        return error.body or ""


def refused(call) -> str:
    """The message of the 403 `call` gets."""
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status == 403, caught.value.body
    return message(caught.value)


def _without_the_crds_name_rule(plane: ControlPlane) -> None:
    """The CRD as an install that never took the rule self.metadata.name == self.spec.nodeName has it."""
    crd = json.loads(plane.kubectl("get", "crd", CRD, "-o", "json").stdout)
    rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    assert "self.metadata.name == self.spec.nodeName" in [r["rule"] for r in rules]
    plane.kubectl("patch", "crd", CRD, "--type=json", "-p", json.dumps([
        {"op": "remove", "path": "/spec/versions/0/schema/openAPIV3Schema/x-kubernetes-validations"}]))

    def admitted() -> bool:
        try:
            k8s.CustomObjectsApi(plane.api_client()).create_cluster_custom_object(
                *NODEIMAGES, node_images(NODE_A, NODE_B), dry_run="All")
        except ApiException as exc:
            if exc.status == 422:
                return False
            raise
        return True

    wait_for(admitted, "the apiserver serves the CRD without its rule")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[Install]:
    folder = tmp_path_factory.mktemp("agent-policy")
    with running_control_plane(folder / "plane") as plane:
        for name in (NODE_A, NODE_B):
            create_node(plane, name)
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=folder, delete=False) as values:
            json.dump(VALUES, values)
        install = Install(plane, folder)
        # From a registry, as the chart's README publishes it: an install from oci://.
        registry = Registry(folder / "registry").start()
        try:
            reference, _ = publish_as_readme(registry, folder)
            install.helm("install", RELEASE, reference, "--version", RELEASED, "--ca-file", str(registry.ca),
                         "--create-namespace", "--values", values.name)
        finally:
            registry.stop()
        _without_the_crds_name_rule(plane)
        install.agent_pod = plane.core().create_namespaced_pod(AGENT_NAMESPACE, {
            "metadata": {"name": "agent-on-node-a"},
            "spec": {"serviceAccountName": AGENT, "nodeName": NODE_A,
                     "containers": [{"name": "agent", "image": "image-preflight:test"}]}})
        # The policies are in force once the apiserver's admission has loaded them.
        unbound = k8s.CustomObjectsApi(install.token(AGENT_NAMESPACE, AGENT))
        wait_for(lambda: _refused_dry_run(unbound), "the agent's policy is in force")
        yield install


def _refused_dry_run(custom: k8s.CustomObjectsApi) -> bool:
    try:
        custom.create_cluster_custom_object(*NODEIMAGES, node_images(NODE_A), dry_run="All")
    except ApiException as exc:
        return exc.status == 403 and message(exc).endswith(NO_POD)
    return False


@pytest.fixture
def lists(installed) -> Iterator[Install]:
    """The install, with no NodeImages object before and after the test."""
    installed.delete_lists()
    yield installed
    installed.delete_lists()


def test_a_node_bound_token_of_the_agents_account_writes_no_nodes_list(lists):
    """Such a token carries authentication.kubernetes.io/node-name as a Pod's does, but no
    pod-name: it is refused for the node it names and for any other, created or replaced."""
    custom = k8s.CustomObjectsApi(lists.agent_bound_to_node(NODE_B))
    for name in (NODE_B, NODE_A):
        said = refused(lambda: custom.create_cluster_custom_object(*NODEIMAGES, node_images(name)))
        assert said.endswith(f"denied request: a token bound to node {NODE_B} but to no Pod: {NO_POD}"), said
        assert lists.stored(name) is None
    kept = lists.admin.create_cluster_custom_object(*NODEIMAGES, node_images(NODE_B))
    rewritten = {**kept, "spec": {**kept["spec"], "images": SAMPLE}}
    refused(lambda: custom.replace_cluster_custom_object(*NODEIMAGES, NODE_B, rewritten))
    assert lists.stored(NODE_B)["spec"]["images"] == []


def test_the_agent_with_its_pods_token_writes_its_nodes_list_and_names_no_other_node_in_it(lists):
    """The agent's own calls (Publisher: create, then replace) go through; a list named after its
    node but giving another node as spec.nodeName, which readers go by, does not, though the CRD
    here lets it by; nor does a list named after another node."""
    api = lists.agent_bound_to_its_pod()
    publisher = Publisher(api, NODE_A, lease_seconds=30)
    assert publisher.publish(SAMPLE, now=T0) == CREATE
    assert publisher.publish(SAMPLE, now=T0 + 20) == RENEW
    stored = lists.stored(NODE_A)
    assert (stored["spec"]["nodeName"], stored["spec"]["images"]) == (NODE_A, SAMPLE)

    custom = k8s.CustomObjectsApi(api)
    elsewhere = {**stored, "spec": {**stored["spec"], "nodeName": NODE_B}}
    said = refused(lambda: custom.replace_cluster_custom_object(*NODEIMAGES, NODE_A, elsewhere))
    assert said.endswith(f"image-preflight-agent on node {NODE_A} may write only the NodeImages of node {NODE_A},"
                         f" not one whose spec.nodeName is {NODE_B}"), said
    assert lists.stored(NODE_A)["spec"]["nodeName"] == NODE_A
    said = refused(lambda: custom.create_cluster_custom_object(*NODEIMAGES, node_images(NODE_B)))
    assert said.endswith(f"image-preflight-agent on node {NODE_A} may write only NodeImages {NODE_A}, not {NODE_B}")
    assert lists.stored(NODE_B) is None


def test_the_agent_renews_its_hashed_list_through_its_nodes_lease_and_writes_no_other(lists):
    """The Lease that renews a hashed list is held to the node as the list is: named after it and
    held by it (spec.holderIdentity, which readers go by), with a token bound to the agent's Pod."""
    api = lists.agent_bound_to_its_pod()
    publisher = Publisher(api, NODE_A, lease_seconds=30, hashed=True, namespace=AGENT_NAMESPACE)
    assert publisher.publish(SAMPLE, now=T0) == CREATE
    assert publisher.publish(SAMPLE, now=T0 + 20) == RENEW
    admin = k8s.CoordinationV1Api(lists.plane.api_client())
    lease = admin.read_namespaced_lease(NODE_A, AGENT_NAMESPACE)
    assert (lease.spec.holder_identity, lease.spec.renew_time.timestamp()) == (NODE_A, T0 + 20)
    assert lists.stored(NODE_A)["spec"]["observedAt"] == format_time(T0)  # the list itself not written again

    # As the agent writes them: through the custom-objects path (agent/renewal.py says why).
    leases = (LEASE_GROUP, LEASE_VERSION, AGENT_NAMESPACE, LEASE_PLURAL)
    custom = k8s.CustomObjectsApi(api)
    said = refused(lambda: custom.create_namespaced_custom_object(
        *leases, lease_object(NODE_B, AGENT_NAMESPACE, renewed_at=T0, lease_seconds=30)))
    assert said.endswith(f"image-preflight-agent on node {NODE_A} may write only Lease {NODE_A}, not {NODE_B}"), said
    version = {"resourceVersion": lease.metadata.resource_version}
    held_elsewhere = lease_object(NODE_A, AGENT_NAMESPACE, renewed_at=T0 + 21, lease_seconds=30)
    held_elsewhere["spec"]["holderIdentity"] = NODE_B
    held_elsewhere["metadata"] |= version
    said = refused(lambda: custom.replace_namespaced_custom_object(*leases, NODE_A, held_elsewhere))
    assert said.endswith(f"image-preflight-agent on node {NODE_A} may write only the Lease of node {NODE_A},"
                         f" not one whose spec.holderIdentity is {NODE_B}"), said
    # A token bound to the Node object alone renews nothing, its own node's Lease included.
    node_bound = k8s.CustomObjectsApi(lists.agent_bound_to_node(NODE_A))
    renewal = lease_object(NODE_A, AGENT_NAMESPACE, renewed_at=T0 + 22, lease_seconds=30)
    renewal["metadata"] |= version
    said = refused(lambda: node_bound.replace_namespaced_custom_object(*leases, NODE_A, renewal))
    assert said.endswith(f"a token bound to node {NODE_A} but to no Pod: image-preflight-agent may write Lease only"
                         " with a token bound to a Pod on a node"), said
    assert admin.read_namespaced_lease(NODE_A, AGENT_NAMESPACE).spec.renew_time.timestamp() == T0 + 20


def test_a_delete_by_the_agent_is_held_to_the_node_of_the_list_it_deletes(lists):
    """The agent's role grants no delete; should another role grant it, the policy still reads the
    node of a deleted list from oldObject, as a DELETE carries no object."""
    rbac = k8s.RbacAuthorizationV1Api(lists.plane.api_client())
    name = "test-agent-may-delete-node-images"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["delete"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": name},
                                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": name},
                                      "subjects": [{"kind": "ServiceAccount", "name": AGENT,
                                                    "namespace": AGENT_NAMESPACE}]})
    try:
        custom = k8s.CustomObjectsApi(lists.agent_bound_to_its_pod())
        wait_for(lambda: _may_delete(custom), "RBAC grants the agent delete")
        lists.admin.create_cluster_custom_object(*NODEIMAGES, node_images(NODE_A, NODE_B))
        said = refused(lambda: custom.delete_cluster_custom_object(*NODEIMAGES, NODE_A))
        assert said.endswith(f"not one whose spec.nodeName is {NODE_B}"), said
        assert lists.stored(NODE_A) is not None
        lists.admin.create_cluster_custom_object(*NODEIMAGES, node_images(NODE_B))
        said = refused(lambda: custom.delete_cluster_custom_object(*NODEIMAGES, NODE_B))
        assert said.endswith(f"may write only NodeImages {NODE_A}, not {NODE_B}"), said
        # Its own node's list, as the node's: deleted.
        lists.admin.patch_cluster_custom_object(*NODEIMAGES, NODE_A, {"spec": {"nodeName": NODE_A}})
        custom.delete_cluster_custom_object(*NODEIMAGES, NODE_A)
        assert lists.stored(NODE_A) is None and lists.stored(NODE_B) is not None
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def _may_delete(custom: k8s.CustomObjectsApi) -> bool:
    """RBAC's cache has the new binding: a delete of a list that is not there is a 404, not a 403."""
    try:
        custom.delete_cluster_custom_object(*NODEIMAGES, "no-such-node")
    except ApiException as exc:
        return exc.status == 404
    return True


def _job(name: str) -> dict:
    """A Job the test namespace's Pod Security level (restricted) admits."""
    container = {"name": "job", "image": "busybox:1.36", "command": ["true"],
                 "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 1000,
                                     "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}}


def test_the_helm_test_account_creates_a_job_only_as_a_dry_run(installed):
    """RBAC lets it create Jobs in its namespace, for doctor's dry-run rollout Job; the chart's
    policy keeps every write of the account a dry run."""
    batch = k8s.BatchV1Api(installed.token(NAMESPACE, TEST_ACCOUNT))
    assert batch.create_namespaced_job(TEST_NAMESPACE, _job("dry-run"), dry_run="All").metadata.name == "dry-run"
    said = refused(lambda: batch.create_namespaced_job(TEST_NAMESPACE, _job("for-real")))
    assert said.endswith("denied request: image-preflight-test writes only dry runs, not this CREATE of jobs"), said
    admin = k8s.BatchV1Api(installed.plane.api_client())
    assert admin.list_namespaced_job(TEST_NAMESPACE).items == []


# --- helm uninstall: last, it removes the release --------------------------------------------------


def test_a_failing_uninstall_hook_leaves_none_of_its_objects_behind(installed):
    """The hook's Job never completes here, so Helm fails the hook at --timeout. The Job goes by
    hook-failed, its ServiceAccount, role, binding and NetworkPolicy, run before it, by
    hook-succeeded (Helm 3.19 and later, pkg/action/hooks.go)."""
    done = installed.helm("uninstall", RELEASE, "--timeout", "15s", check=False)
    # Without --wait, the hook's Job is the one thing `helm uninstall` waits for.
    assert done.returncode != 0 and "timed out waiting for the condition" in done.stderr, done.stderr
    plane = installed.plane
    left = plane.kubectl("get", "jobs,serviceaccounts,networkpolicies", "-n", NAMESPACE, "-o", "name").stdout.split()
    left += plane.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name").stdout.split()
    assert [name for name in left if name.endswith("/" + UNINSTALL)] == []
