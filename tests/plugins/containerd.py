"""A private containerd for a test (tests/containerd.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.containerd import Containerd, containerd2_binary, require_containerd


@pytest.fixture
def containerd() -> Iterator[Containerd]:
    """A started containerd with CRI and no images."""
    require_containerd()
    with Containerd() as runtime:
        yield runtime


@pytest.fixture
def containerd2() -> Iterator[Containerd]:
    """A started containerd 2.x (containerd2_binary()) with CRI and no images."""
    with Containerd(binary=containerd2_binary()) as runtime:
        yield runtime
