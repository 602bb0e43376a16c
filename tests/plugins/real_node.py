"""The real node (tests/node/real_node.py), once a session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.node.real_node import RealNode, TeardownError, running_real_node


@pytest.fixture(scope="session")
def real_node(tmp_path_factory) -> Iterator[RealNode]:
    """running_real_node's node. What its teardown finds fails that teardown in one line, with no
    traceback: the problem is the node's, not the code's that found it."""
    try:
        with running_real_node(tmp_path_factory.mktemp("realnode-plane")) as node:
            yield node
    except TeardownError as found:
        pytest.fail(str(found), pytrace=False)
