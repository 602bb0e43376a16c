"""Fixtures shared across test modules: a real containerd, and the in-test API server."""

pytest_plugins = ["tests.containerd", "tests.fake_apiserver", "tests.controlplane.cluster", "tests.node.real_node",
                  "tests.node.preflight_image"]
