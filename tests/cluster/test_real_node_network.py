"""What the real node's teardown and every throwaway containerd's close read in containerd's log
to prove no pull left the machine (tests/containerd.py, outside_requests), on lines containerd
2.4.2 wrote in the tests."""

import pytest

from tests.containerd import STUB_REGISTRY, ContainerdError, outside_requests

STUB = "127.0.0.1:36333"
STUB_LINES = """\
time="2026-12-01T10:59:44.866753239Z" level=debug msg=resolving host="127.0.0.1:36333" method=HEAD url="https://127.0.0.1:36333/v2/jyangballin/absent/manifests/openai?ns=docker.io"
time="2026-12-01T10:59:44.868915033Z" level=info msg="trying next host" error="failed to do request: Head \\"https://127.0.0.1:36333/v2/jyangballin/absent/manifests/openai?ns=docker.io\\": tls: first record does not look like a TLS handshake" host="127.0.0.1:36333" method=HEAD url="https://127.0.0.1:36333/v2/jyangballin/absent/manifests/openai?ns=docker.io"
time="2026-12-01T10:59:44.873474344Z" level=error msg="PullImage \\"docker.io/jyangballin/absent:openai\\" failed" error="rpc error: code = NotFound desc = failed to pull and unpack image \\"docker.io/jyangballin/absent:openai\\": failed to resolve image: docker.io/jyangballin/absent:openai: not found"
"""  # noqa: E501 - containerd's log lines as it wrote them, one a line


def test_requests_to_the_stub_alone_pass():
    assert outside_requests(STUB_LINES, STUB) == []


def test_a_request_to_a_real_registry_is_caught():
    line = ('time="2026-12-01T10:59:44Z" level=debug msg=resolving host=registry-1.docker.io method=HEAD '
            'url="https://registry-1.docker.io/v2/library/busybox/manifests/latest"')
    assert outside_requests(STUB_LINES + line, STUB) == [line]


def test_a_lookup_or_a_dial_elsewhere_is_caught():
    lookup = ('time="2026-12-01T10:59:44Z" level=info msg="trying next host" error="failed to do request: Head '
              '\\"https://registry.local/v2/x/manifests/v1\\": dial tcp: lookup registry.local on 10.0.0.2:53: '
              'dial udp 10.0.0.2:53: connect: network is unreachable"')
    assert outside_requests(lookup, STUB) == [lookup]


def test_the_registry_a_node_trusts_passes_and_every_other_host_is_still_caught():
    """RealNode.trust_registry: the quickstart's registry, pulled from and, while the doctor test
    has it down, refused; anything else as before."""
    registry = "10.201.0.1:41234"
    pulled = (f'time="2026-12-07T00:00:00Z" level=debug msg=resolving host="{registry}" method=HEAD '
              f'url="https://{registry}/v2/ml-infra/image-preflight/manifests/0.2.0"\n')
    down = (f'time="2026-12-07T00:00:00Z" level=info msg="trying next host" error="failed to do request: Head '
            f'\\"https://{registry}/v2/ml-infra/image-preflight/manifests/0.2.0\\": dial tcp {registry}: '
            f'connect: connection refused" host="{registry}"\n')
    elsewhere = ('time="2026-12-07T00:00:00Z" level=debug msg=resolving host=registry-1.docker.io method=HEAD '
                 'url="https://registry-1.docker.io/v2/library/busybox/manifests/latest"')
    assert outside_requests(STUB_LINES + pulled + down, STUB, registry) == []
    assert outside_requests(STUB_LINES + pulled + down + elsewhere, STUB, registry) == [elsewhere]
    assert outside_requests(pulled, STUB) == [pulled.rstrip("\n")]


def test_a_throwaway_containerd_fails_its_close_on_any_host_but_its_stub(containerd):
    stub = f'time="2026-12-03T00:00:00Z" level=debug msg=resolving host="{STUB_REGISTRY}" method=HEAD\n'
    with open(containerd.log_path, "a", encoding="utf-8") as log:
        log.write(stub)
    assert containerd.outside_requests() == []
    with open(containerd.log_path, "a", encoding="utf-8") as log:
        log.write('time="2026-12-03T00:00:00Z" level=debug msg=resolving host=registry-1.docker.io method=HEAD\n')
    with pytest.raises(ContainerdError, match="beyond the loopback stub"):
        containerd.close()
