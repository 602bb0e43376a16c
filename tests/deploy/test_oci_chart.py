"""The chart released as its peers release theirs: `helm package`, `helm push` to an OCI registry
(distribution's, tests/oci_registry.py, over TLS), and read back from `oci://` by Helm 3 and Helm 4
as the same chart; and the annotations chart indexes read (Artifact Hub) say what the chart holds.

Installing from `oci://` on a cluster is the quickstart's (tests/cluster/test_real_node_chart.py).
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.chart import CHART, NAMESPACE, RELEASE, case_file, documents, helm_binary, template
from tests.oci_registry import Registry, publish_as_readme
from tests.release import ROOT, VERSION

HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"  # helm.sh/helm/v3/pkg/registry/constants.go
HELM_CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    served = Registry(tmp_path_factory.mktemp("oci-registry")).start()
    yield served
    served.stop()


def _helm(helm: str, home: Path, *args: str) -> tuple[str, str]:
    """`helm *args` with its configuration, cache and registry logins in `home`, not the user's:
    what it printed, and what it said on stderr (where it reports pushes and pulls)."""
    env = {**os.environ, "HELM_CONFIG_HOME": str(home / "config"), "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_DATA_HOME": str(home / "data")}
    done = subprocess.run([helm_binary(helm), *args], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, f"{helm} {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done.stdout, done.stderr


@pytest.mark.parametrize("helm", ["helm", "helm4"])
def test_the_packaged_chart_pushed_to_a_registry_is_the_chart(helm, registry, tmp_path):
    packaged = _helm(helm, tmp_path, "package", str(CHART), "--destination", str(tmp_path))[0]
    archive = tmp_path / f"image-preflight-{VERSION}.tgz"
    assert archive.is_file(), packaged
    repository = f"charts-{helm}"
    pushed = _helm(helm, tmp_path, "push", str(archive), f"oci://{registry.host}/{repository}",
                   "--ca-file", str(registry.ca))
    pushed = "".join(pushed)
    assert f"{registry.host}/{repository}/image-preflight:{VERSION}" in pushed

    manifest, headers = registry.get(f"{repository}/image-preflight/manifests/{VERSION}", accept=OCI_MANIFEST)
    assert manifest["config"]["mediaType"] == HELM_CONFIG
    assert [layer["mediaType"] for layer in manifest["layers"]] == [HELM_CHART_LAYER]
    digest = headers["Docker-Content-Digest"]
    assert f"Digest: {digest}" in pushed

    reference = f"oci://{registry.host}/{repository}/image-preflight"
    shown = _helm(helm, tmp_path, "show", "chart", reference, "--version", VERSION, "--ca-file", str(registry.ca))[0]
    assert yaml.safe_load(shown) == yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    # cert-manager's certificates: the default mode's are generated anew at each rendering.
    rendered = _helm(helm, tmp_path, "template", RELEASE, reference, "--version", VERSION, "--namespace", NAMESPACE,
                     "--values", str(case_file("cert-manager")), "--ca-file", str(registry.ca))[0]
    assert documents(rendered) == documents(template(case="cert-manager", helm=helm).stdout)
    # By digest too, as a release pinned to what was pushed would install it.
    by_digest = _helm(helm, tmp_path, "show", "chart", f"{reference}@{digest}", "--ca-file", str(registry.ca))[0]
    assert yaml.safe_load(by_digest)["version"] == VERSION


def test_the_chart_readme_publishes_the_chart_as_printed(registry, tmp_path):
    reference, arguments = publish_as_readme(registry, tmp_path)
    assert reference == f"oci://{registry.host}/image-preflight/charts/image-preflight"
    assert arguments[:2] == ["--version", VERSION]
    shown = _helm("helm", tmp_path, "show", "chart", reference, "--version", VERSION, "--ca-file", str(registry.ca))[0]
    assert yaml.safe_load(shown)["version"] == VERSION


def test_a_registry_the_client_does_not_trust_is_refused(registry, tmp_path):
    archive = tmp_path / "none.tgz"
    done = subprocess.run([helm_binary(), "show", "chart", f"oci://{registry.host}/charts-helm/image-preflight",
                           "--version", VERSION], capture_output=True, text=True, check=False,
                          env={**os.environ, "HELM_CACHE_HOME": str(tmp_path), "HELM_CONFIG_HOME": str(tmp_path)})
    assert done.returncode != 0 and "certificate" in done.stderr, done.stderr
    assert not archive.exists()


def test_the_annotations_chart_indexes_read_say_what_the_chart_holds():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    annotations = chart["annotations"]
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    image = f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"
    assert yaml.safe_load(annotations["artifacthub.io/images"]) == [{"name": "image-preflight", "image": image}]
    crd = yaml.safe_load((CHART / "files" / "nodeimages-crd.yaml").read_text(encoding="utf-8"))
    listed = yaml.safe_load(annotations["artifacthub.io/crds"])
    assert [(c["kind"], c["version"], c["name"]) for c in listed] == [
        (crd["spec"]["names"]["kind"], version["name"], crd["metadata"]["name"]) for version in crd["spec"]["versions"]]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert annotations["artifacthub.io/license"] == project["license"]["text"]
    # Artifact Hub's categories (artifacthub.io/docs/topics/annotations/helm).
    assert annotations["artifacthub.io/category"] in {
        "ai-machine-learning", "database", "integration-delivery", "monitoring-logging", "networking", "security",
        "storage", "streaming-messaging"}
