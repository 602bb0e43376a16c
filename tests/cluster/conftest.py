"""Fixtures the cluster tests share: the chart applied on the test control plane, and on the real node."""

from __future__ import annotations

import pytest

from tests.chart import API_ONLY, apply, merged, secret_values
from tests.cluster.real_stack import ABSENT, HELD, Stack
from tests.cluster.watchdog_process import Watchdog
from tests.controlplane.cluster import wait_for
from tests.controlplane.webhook import ServedWebhook


@pytest.fixture(scope="session")
def deployed(control_plane, webhook_certs):
    """The chart applied for real, less its hooks, with the certificate of `image-preflight certs`
    (certificates.mode secret); that certificate's folder, for `serve`."""
    apply(control_plane, merged(API_ONLY, secret_values(webhook_certs)))
    return webhook_certs


@pytest.fixture(scope="module")
def stack(real_node, webhook_certs, tmp_path_factory):
    """The chart on the real node's control plane (steering on, the certificate of `image-preflight
    certs`), with `serve --steer` and `watchdog` as host processes of their own ServiceAccounts.
    The chart's own Pods are not started here (their image is not on the node): its Deployments
    and DaemonSet are left out."""
    plane = real_node.plane
    folder = tmp_path_factory.mktemp("real-node-stack")
    values = merged(API_ONLY, secret_values(webhook_certs), {"webhook": {"steering": {"enabled": True}}})
    apply(plane, values, workloads=False)
    certs = webhook_certs
    served = ServedWebhook(plane, certs, plane.service_account_kubeconfig(
        "image-preflight", "image-preflight", folder / "serve.kubeconfig"), folder / "serve.log", "--steer")
    watchdog = Watchdog(plane, plane.service_account_kubeconfig(
        "image-preflight", "image-preflight-watchdog", folder / "watchdog.kubeconfig"), folder / "watchdog.log")
    served.start()
    watchdog.start()
    real_node.import_images([HELD])
    real_node.wait_in_status(HELD)
    stack = Stack(real_node, served, watchdog, folder, values)
    wait_for(lambda: stack.dry_run(stack.namespace(), ABSENT)[0] != 0, "the apiserver calls the webhook")
    try:
        yield stack
    finally:
        watchdog.stop()
        served.stop()
        for namespace in stack.namespaces:
            plane.core().delete_namespace(namespace)
