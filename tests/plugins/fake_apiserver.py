"""The apiserver's double for a test (tests/fake_apiserver.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s_client

from tests.fake_apiserver import FakeApiServer, make_api_client


@pytest.fixture
def fake_apiserver() -> Iterator[FakeApiServer]:
    """A started server with core/v1 nodes registered and a short bookmark interval."""
    with FakeApiServer(bookmark_interval=0.2) as server:
        server.register(resource="nodes", kind="Node")
        yield server


@pytest.fixture
def fake_api_client(fake_apiserver: FakeApiServer) -> Iterator[k8s_client.ApiClient]:
    api_client = make_api_client(fake_apiserver)
    yield api_client
    api_client.close()
