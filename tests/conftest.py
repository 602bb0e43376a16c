"""Fixtures and plugins shared across the test folders, and the `cluster` marker.

The plugins (tests/plugins/) need the extras (grpc, the Kubernetes client, the server stack): each
is loaded when they are installed, so that tests/core/ runs with the base install alone."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from image_preflight.faces import extra_top_levels
from tests.chart import write_webhook_certs

# The top-level modules the extras bring; a plugin that cannot import one of them is left out.
EXTRAS = extra_top_levels()
PLUGINS = ("tests.plugins.containerd", "tests.plugins.fake_apiserver", "tests.plugins.control_plane",
           "tests.plugins.real_node", "tests.plugins.preflight_image")
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
def webhook_certs(tmp_path_factory) -> Path:
    """tests.chart.write_webhook_certs in a temp dir, so that no key is ever written into the tree."""
    return write_webhook_certs(tmp_path_factory.mktemp("webhook-certs"))


@pytest.fixture
def cluster(service_accounts, case, tmp_path):
    """The node agent's view of the real apiserver, as its ServiceAccount (tests.agent_cluster.Cluster)."""
    from tests.agent_cluster import NODE, Cluster

    kubeconfig = service_accounts.service_account_kubeconfig("image-preflight-agent", "image-preflight-agent",
                                                             tmp_path / "agent.kubeconfig")
    api_client = service_accounts.api_client(kubeconfig)
    yield Cluster(service_accounts, case.name(NODE), kubeconfig, api_client)
    api_client.close()
