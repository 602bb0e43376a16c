"""Fixtures the cluster tests share: deploy/ applied on the test control plane, and on the real node."""

from __future__ import annotations

import pytest
import yaml

from tests.builders import SELF_SIGNED
from tests.cluster.real_stack import ABSENT, HELD, Stack, apply_without_pods
from tests.cluster.watchdog_process import Watchdog
from tests.controlplane.cluster import wait_for
from tests.controlplane.webhook import ServedWebhook


@pytest.fixture(scope="session")
def deployed(control_plane, deploy_copy):
    """The self-signed overlay and the node agent applied for real, with certificates from
    `image-preflight certs`."""
    control_plane.kubectl("apply", "--server-side", "-k", str(deploy_copy / "agent"))
    control_plane.kubectl("wait", "--for=condition=Established", "crd/nodeimages.image-preflight.io")
    control_plane.kubectl("apply", "--server-side", "-k", str(deploy_copy / SELF_SIGNED))
    return deploy_copy / SELF_SIGNED / "certs"


@pytest.fixture(scope="module")
def stack(real_node, deploy_copy, tmp_path_factory):
    """deploy/ on the real node's control plane (self-signed overlay, watchdog and steering
    components, the agent's CRD and RBAC), with `serve --steer` and `watchdog` as host processes
    of their own ServiceAccounts. The manifests' own Pods are not started here (their image is
    not on the node); the webhook's Deployment is scaled to none and the agent's DaemonSet removed."""
    plane = real_node.plane
    folder = tmp_path_factory.mktemp("real-node-stack")
    overlay = deploy_copy / "_real-node"
    overlay.mkdir(exist_ok=True)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [f"../{SELF_SIGNED}"], "components": ["../components/watchdog", "../components/steer"]}))
    plane.kubectl("apply", "--server-side", "-k", str(deploy_copy / "agent"))
    plane.kubectl("wait", "--for=condition=Established", "crd/nodeimages.image-preflight.io")
    plane.kubectl("-n", "image-preflight-agent", "delete", "daemonset", "--all")
    apply_without_pods(plane, overlay)
    certs = deploy_copy / SELF_SIGNED / "certs"
    served = ServedWebhook(plane, certs, plane.service_account_kubeconfig(
        "image-preflight", "image-preflight", folder / "serve.kubeconfig"), folder / "serve.log", "--steer")
    watchdog = Watchdog(plane, plane.service_account_kubeconfig(
        "image-preflight", "image-preflight-watchdog", folder / "watchdog.kubeconfig"), folder / "watchdog.log")
    served.start()
    watchdog.start()
    real_node.import_images([HELD])
    real_node.wait_in_status(HELD)
    stack = Stack(real_node, served, watchdog, folder)
    stack.overlay = overlay
    wait_for(lambda: stack.dry_run(stack.namespace(), ABSENT)[0] != 0, "the apiserver calls the webhook")
    try:
        yield stack
    finally:
        watchdog.stop()
        served.stop()
        for namespace in stack.namespaces:
            plane.core().delete_namespace(namespace)
