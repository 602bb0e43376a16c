"""The control plane the tests share (tests/controlplane/cluster.py), and what each test and module
leaves in it. A test using `control_plane`, `service_accounts` or a fixture over them is a cluster
test (tests/conftest.py marks it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.controlplane.cluster import (
    SHARED,
    Case,
    ControlPlane,
    apply_service_accounts,
    open_nodes,
    running_control_plane,
)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory) -> Iterator[ControlPlane]:
    """The cluster the tests share. Tests that restart or compact it use one of their own."""
    with running_control_plane(tmp_path_factory.mktemp("controlplane")) as plane:
        SHARED.append(plane)
        try:
            yield plane
        finally:
            SHARED.remove(plane)


@pytest.fixture(scope="module", autouse=True)
def no_open_node_left():
    """A module leaves no Node behind that a Pod without a nodeSelector may land on: the webhook's
    and steering's tests decide over every such node, so one left behind with a capped or lapsed
    list would decide their Pods. One found is deleted, and the module fails naming it."""
    before = open_nodes()
    yield
    left = sorted(open_nodes() - before)
    if left:
        core = SHARED[0].core()
        for name in left:
            core.delete_node(name)
        pytest.fail(f"this module left node(s) {', '.join(left)} that a Pod without a nodeSelector may land on "
                    "(deleted now)", pytrace=False)


@pytest.fixture(scope="session")
def service_accounts(control_plane) -> ControlPlane:
    """The control plane with apply_service_accounts' objects."""
    apply_service_accounts(control_plane)
    return control_plane


@pytest.fixture
def case(control_plane) -> Iterator[Case]:
    created = Case(control_plane)
    yield created
    created.clean_up()
