"""Fixtures and plugins shared across the test folders, and the `cluster` marker.

The plugins need the extras (grpc, the Kubernetes client, the server stack): each is loaded when
they are installed, so that tests/core/ runs with the base install alone."""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from image_preflight.cli import main
from tests.builders import COMPONENTS, DEPLOY, NAMESPACE, SELF_SIGNED, SERVICE, base_of
from tests.needs import unavailable

# The top-level modules the extras bring; a plugin that cannot import one of them is left out.
EXTRAS = frozenset({"grpc", "google", "kubernetes", "cryptography", "fastapi", "uvicorn", "prometheus_client",
                    "orjson", "httpx", "kr8s"})
PLUGINS = ("tests.containerd", "tests.fake_apiserver", "tests.controlplane.cluster", "tests.node.real_node",
           "tests.node.preflight_image")
# Fixtures that start the control plane or stand on the real node: a test using one is a cluster test.
CLUSTER_FIXTURES = frozenset({"control_plane", "service_accounts", "real_node"})
CLUSTER_FOLDER = Path(__file__).parent / "cluster"


def _loadable(plugin: str) -> bool:
    try:
        importlib.import_module(plugin)
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] in EXTRAS:
            return False
        raise
    return True


pytest.register_assert_rewrite(*PLUGINS)  # before _loadable imports them
pytest_plugins = [plugin for plugin in PLUGINS if _loadable(plugin)]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(CLUSTER_FOLDER) or CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture
def start_webhook(tmp_path):
    """Start `serve` in a thread with the given extra arguments; stopped cleanly after the test."""
    pytest.importorskip("uvicorn", reason="`serve` needs the webhook extra")
    from tests.serving import serving_webhooks

    yield from serving_webhooks(tmp_path)


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory) -> Path:
    """deploy/ in a temp dir with fresh certificates for the self-signed overlay and one overlay
    per component, so that nothing is written into the tree and no key is ever committed."""
    copy = tmp_path_factory.mktemp("deploy") / "deploy"
    own_certs = DEPLOY / SELF_SIGNED / "certs"
    shutil.copytree(DEPLOY, copy, ignore=lambda folder, names: ["certs"] if Path(folder) == own_certs.parent else [])
    if (copy / SELF_SIGNED).is_dir():
        out_dir = copy / SELF_SIGNED / "certs"
        assert main(["certs", "--service", SERVICE, "--namespace", NAMESPACE, "--out-dir", str(out_dir)]) == 0
    for component in COMPONENTS:
        overlay = copy / "_on-base" / component.replace("/", "-")
        overlay.mkdir(parents=True)
        kustomization = {"resources": [f"../../{base_of(component)}"], "components": [f"../../{component}"]}
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    return copy


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        unavailable("kubectl not on PATH: cannot run `kubectl kustomize`")
    return path


def _target_dir(copy: Path, target: str) -> Path:
    if "+" in target:
        return copy / "_on-base" / target.partition("+")[2].replace("/", "-")
    return copy / target


@pytest.fixture(scope="session")
def render(kubectl, deploy_copy):
    """render(target): the text and documents `kubectl kustomize` makes of a deploy/ target
    (builders.TARGETS) in deploy_copy, rendered once a session."""
    cache: dict[str, tuple[str, list[dict]]] = {}

    def rendered(target: str) -> tuple[str, list[dict]]:
        if target not in cache:
            result = subprocess.run(
                [kubectl, "kustomize", str(_target_dir(deploy_copy, target))],
                capture_output=True, text=True, check=False,
            )
            if result.returncode != 0:
                pytest.fail(f"kubectl kustomize deploy/{target} failed: {result.stderr.strip()}")
            cache[target] = (result.stdout, [d for d in yaml.safe_load_all(result.stdout) if d])
        return cache[target]

    return rendered


@pytest.fixture
def cluster(service_accounts, case, tmp_path):
    """The node agent's view of the real apiserver, as its ServiceAccount (tests.agent_cluster.Cluster)."""
    from tests.agent_cluster import NODE, Cluster

    kubeconfig = service_accounts.service_account_kubeconfig("image-preflight-agent", "image-preflight-agent",
                                                             tmp_path / "agent.kubeconfig")
    api_client = service_accounts.api_client(kubeconfig)
    yield Cluster(service_accounts, case.name(NODE), kubeconfig, api_client)
    api_client.close()
