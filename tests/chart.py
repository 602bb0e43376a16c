"""The Helm chart (deploy/chart/image-preflight) as the tests render and apply it, with the `helm`
tests/controlplane/build makes from its Go module. The chart's own cases are its ci/*-values.yaml,
the files `helm lint` and chart-testing take; a test's other values come as a dict."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from image_preflight.cli import main
from tests.needs import unavailable

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "chart" / "image-preflight"
CASES = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
RELEASE = NAMESPACE = SERVICE = "image-preflight"
AGENT_NAMESPACE = "image-preflight-agent"
# What `helm install` waits for and the tests do not run on an API-only cluster.
WORKLOADS = frozenset({"Deployment", "DaemonSet"})
# The values of a cluster whose faces run as the tests' own processes: no helm test there; the
# agents' DaemonSet on no node unless a test labels one (a Pod there would only wait: no kubelet
# runs it); and no node restriction, which refuses the tests' agents their writes, as it should
# (their tokens are bound to no Pod). tests/cluster/test_real_node_chart.py shows both policies at
# work.
API_ONLY = {"tests": {"enabled": False},
            "agent": {"nodeSelector": {"image-preflight.test/agent": "true"}, "nodeRestriction": {"enabled": False}}}
# The watchdog's write policy and binding, which the chart renders whenever the watchdog is
# enabled: `apply` leaves them out unless asked, as the watchdog's tests act with its token in
# namespaces the running watchdog does not watch (tests/cluster/test_cluster_policies.py applies them).
WATCHDOG_POLICY = "image-preflight-watchdog-writes"


def helm_binary(name: str = "helm") -> str:
    """`helm` (3) or `helm4` from tests/controlplane/build's folder on PATH."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} not on PATH: export PATH=\"$(tests/controlplane/build | tail -n 1):$PATH\"")
    return path


def case_file(case: str) -> Path:
    return CHART / "ci" / f"{case}-values.yaml"


def template(values: Mapping | None = None, *, case: str | None = None, namespace: str = NAMESPACE,
             hooks: bool = True, helm: str = "helm", check: bool = True
             ) -> subprocess.CompletedProcess:
    """`helm template` of the chart as release image-preflight: a ci/ case's values, then `values`."""
    command = [helm_binary(helm), "template", RELEASE, str(CHART), "--namespace", namespace]
    if not hooks:
        command += ["--no-hooks", "--skip-tests"]
    return _run(command, values, case, check)


def notes(values: Mapping | None = None, *, case: str | None = None, namespace: str = NAMESPACE) -> str:
    """The chart's NOTES.txt as `helm install` prints it: `helm template` leaves it out, and Helm 3's
    dry run needs a cluster, so Helm 4's client-side dry run renders it."""
    command = [helm_binary("helm4"), "install", RELEASE, str(CHART), "--namespace", namespace,
               "--dry-run=client", "--output", "json"]
    return json.loads(_run(command, values, case, True).stdout)["info"]["notes"]


def _run(command: list[str], values: Mapping | None, case: str | None, check: bool) -> subprocess.CompletedProcess:
    """`command` with a ci/ case's values, then `values`."""
    if case is not None:
        command += ["--values", str(case_file(case))]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as given:
        if values:
            json.dump(values, given)
            given.flush()
            command += ["--values", given.name]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return done


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(values: Mapping | None = None, **options) -> list[dict]:
    return documents(template(values, **options).stdout)


def write_webhook_certs(out_dir: Path) -> Path:
    """A CA and serving certificate from `image-preflight certs` for the chart's Service, in
    `out_dir`, which secret_values and `serve` read."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if main(["certs", "--service", SERVICE, "--namespace", NAMESPACE, "--out-dir", str(out_dir)]) != 0:
        raise RuntimeError(f"image-preflight certs failed for Service {NAMESPACE}/{SERVICE}")
    return out_dir


def secret_values(certs: Path) -> dict:
    """certificates.mode secret with the caBundle of `image-preflight certs`' CA in `certs`."""
    ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    return {"certificates": {"mode": "secret", "secret": {"caBundle": ca}}}


def merged(*layers: Mapping) -> dict:
    """Values layered as Helm layers --values files: maps merge, anything else is replaced."""
    out: dict = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def apply(plane, values: Mapping | None = None, *, workloads: bool = True, kinds: Sequence[str] = (),
          watchdog_policy: bool = False) -> list[dict]:
    """The chart rendered with `values` and applied server-side as Helm would install it, less
    its hooks and tests, and less the watchdog's write policy unless `watchdog_policy`: the CRD
    first, the release namespace created. `workloads=False` leaves out the Deployments and the
    DaemonSet; `kinds` keeps only those kinds. The objects applied."""
    objects = render(values, hooks=False)
    if not watchdog_policy:
        objects = [o for o in objects if o["metadata"]["name"] != WATCHDOG_POLICY]
    if not workloads:
        objects = [o for o in objects if o["kind"] not in WORKLOADS]
    if kinds:
        objects = [o for o in objects if o["kind"] in kinds or o["kind"] == "CustomResourceDefinition"]
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    rest = [o for o in objects if o["kind"] != "CustomResourceDefinition"]
    if crds:
        plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
        plane.kubectl("wait", "--for=condition=Established", *(f"crd/{o['metadata']['name']}" for o in crds))
    plane.kubectl("create", "namespace", NAMESPACE, check=False)
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(rest))
    # As an upgrade does: a webhook configuration these values no longer render goes (steering's).
    if not kinds:
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            if not any(o["kind"] == kind for o in objects):
                plane.kubectl("delete", kind.lower(), RELEASE, "--ignore-not-found")
    return objects
