"""The chart on the real apiserver (kube-apiserver 1.37, tests/controlplane): each of its ci/ cases
rendered by `helm template` and accepted whole in a server-side dry run, hooks and tests included,
the objects of CRDs that cannot be installed here excepted (cert-manager's, the Prometheus
Operator's: no registry, no network); and examples/swe-smith/admission-review.json carrying
missing-image-job.yaml as that apiserver hands the created Job to a validating webhook."""

from __future__ import annotations

import json
import os
import subprocess

import kubernetes
import pytest
import yaml

from tests.builders.chart_objects import UNINSTALLABLE_GROUPS, api_group
from tests.builders.reviews import EXAMPLES
from tests.chart import CASES, CHART, NAMESPACE, helm_binary, render


@pytest.fixture(scope="module")
def made_for_real(control_plane):
    """Applies objects for real; those that did not exist before are deleted once the module ends,
    so that the session's shared cluster stays as it was."""
    existing = set(control_plane.kubectl("get", "namespaces,serviceaccounts", "-A", "-o", "jsonpath={range .items[*]}"
                                         "{.kind}/{.metadata.namespace}/{.metadata.name} {end}").stdout.split())
    made: dict[str, dict] = {}

    def make(documents: list[dict]) -> None:
        for document in documents:
            control_plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(document))
            key = f"{document['kind']}/{document['metadata'].get('namespace', '')}/{document['metadata']['name']}"
            if document["kind"] != "CustomResourceDefinition" and key not in existing:
                made[key] = document

    yield make
    for document in made.values():
        control_plane.kubectl("delete", "-f", "-", "--wait=false", input=yaml.safe_dump(document), check=False)


@pytest.mark.parametrize("case", CASES)
def test_the_apiserver_accepts_every_object_in_a_server_side_dry_run(case, control_plane, made_for_real, tmp_path):
    """kube-apiserver 1.37 (tests/controlplane) validates, defaults and admits each object."""
    documents = render(case=case)
    # The CRD, the namespaces and the ServiceAccounts are made for real: a dry-run Namespace holds
    # no dry-run objects, a dry-run CRD serves no kind, and a Pod's ServiceAccount must exist.
    control_plane.kubectl("create", "namespace", NAMESPACE, check=False)
    for kind in ("CustomResourceDefinition", "Namespace", "ServiceAccount"):
        made_for_real([d for d in documents if d["kind"] == kind])
    control_plane.kubectl("wait", "--for=condition=Established", "crd/nodeimages.image-preflight.io")
    # Their objects are checked by tests/deploy/test_chart_render.py's cert_manager_problems() and
    # service_monitor_problems() instead.
    checked = [d for d in documents if api_group(d) not in UNINSTALLABLE_GROUPS]
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(yaml.safe_dump_all(checked), encoding="utf-8")
    result = control_plane.kubectl("apply", "--server-side", "--dry-run=server", "-f", str(manifest), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("serverside-applied (server dry run)") == len(checked), result.stdout


def test_helm_install_refuses_a_wrong_value_naming_it_and_installs_nothing(control_plane, tmp_path):
    """values.schema.json on a real cluster: `helm install` stops before any object is made."""
    before = control_plane.kubectl("get", "validatingwebhookconfigurations,clusterroles", "-o", "name").stdout
    done = subprocess.run([helm_binary(), "install", "wrong-value", str(CHART), "--namespace", NAMESPACE,
                           "--kubeconfig", str(control_plane.kubeconfig), "--set", "webhook.failurePolicy=Never"],
                          capture_output=True, text=True, check=False, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert "/webhook/failurePolicy" in done.stderr or "webhook.failurePolicy" in done.stderr, done.stderr
    assert control_plane.kubectl("get", "validatingwebhookconfigurations,clusterroles", "-o", "name").stdout == before
    listed = subprocess.run([helm_binary(), "list", "--all-namespaces", "-q",
                             "--kubeconfig", str(control_plane.kubeconfig)],
                            capture_output=True, text=True, check=True, env={**os.environ, "HOME": str(tmp_path)})
    assert "wrong-value" not in listed.stdout


def test_the_example_admission_review_carries_the_job_as_the_apiserver_sends_it(control_plane):
    """The object of admission-review.json is missing-image-job.yaml after kube-apiserver 1.37's
    defaulting and Job strategy (selector, job-name and controller-uid labels), as a validating
    webhook receives it."""
    review = json.loads((EXAMPLES / "admission-review.json").read_text(encoding="utf-8"))["request"]
    job = yaml.safe_load((EXAMPLES / "missing-image-job.yaml").read_text(encoding="utf-8"))
    namespace = f"example-{os.urandom(4).hex()}"
    control_plane.core().create_namespace({"metadata": {"name": namespace}})
    try:
        answer = kubernetes.client.BatchV1Api(control_plane.core().api_client).create_namespaced_job(
            namespace, job, dry_run="All", _preload_content=False)
    finally:
        control_plane.core().delete_namespace(namespace)
    stored = json.loads(answer.data)
    uid, example_uid = stored["metadata"]["uid"], review["object"]["metadata"]["uid"]
    stored = json.loads(json.dumps(stored).replace(uid, example_uid).replace(namespace, review["namespace"]))
    del stored["metadata"]["managedFields"]
    stored["metadata"]["creationTimestamp"] = review["object"]["metadata"]["creationTimestamp"]
    assert stored == review["object"]
    assert (review["name"], review["operation"]) == (job["metadata"]["name"], "CREATE")
