"""Fixtures the cluster tests share: the chart applied on the test control plane, and on the real node."""

from __future__ import annotations

import pytest

from tests.chart import API_ONLY, apply, merged, secret_values
from tests.cluster.real_stack import running_stack


@pytest.fixture(scope="session")
def deployed(control_plane, webhook_certs):
    """The chart applied for real, less its hooks, with the certificate of `image-preflight certs`
    (certificates.mode secret); that certificate's folder, for `serve`."""
    apply(control_plane, merged(API_ONLY, secret_values(webhook_certs)))
    return webhook_certs


@pytest.fixture(scope="module")
def stack(real_node, webhook_certs, tmp_path_factory):
    """tests.cluster.real_stack.running_stack on the real node, with `image-preflight certs`' certificate."""
    with running_stack(real_node, webhook_certs, tmp_path_factory.mktemp("real-node-stack")) as running:
        yield running
