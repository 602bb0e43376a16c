"""deploy/ on the real apiserver (kube-apiserver 1.37, tests/controlplane): every kustomization
(builders.TARGETS) accepted whole in a server-side dry run, cert-manager's objects excepted as its
CRDs cannot be installed here; and examples/swe-smith/admission-review.json carrying
missing-image-job.yaml as that apiserver hands the created Job to a validating webhook."""

from __future__ import annotations

import json
import os

import kubernetes
import pytest
import yaml

from tests.builders import CERT_MANAGER, EXAMPLES, TARGETS, api_group


@pytest.mark.parametrize("target", TARGETS)
def test_the_apiserver_accepts_every_object_in_a_server_side_dry_run(render, target, control_plane, tmp_path):
    """kube-apiserver 1.37 (tests/controlplane) validates, defaults and admits each object."""
    documents = render(target)[1]
    # The namespaces are made for real: a dry-run Namespace does not hold dry-run objects.
    for namespace in [d for d in documents if d["kind"] == "Namespace"]:
        control_plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(namespace))
    # cert-manager's CRDs cannot be installed here (no registry, no network); its objects are
    # checked by cert_manager_problems() instead.
    checked = [d for d in documents if api_group(d) != CERT_MANAGER]
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(yaml.safe_dump_all(checked), encoding="utf-8")
    result = control_plane.kubectl("apply", "--server-side", "--dry-run=server", "-f", str(manifest), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("serverside-applied (server dry run)") == len(checked), result.stdout


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
