"""`agent`'s flags as its frozen config holds them."""

from __future__ import annotations

import re

import pytest

from image_preflight.agent.config import AgentConfig
from image_preflight.cli import build_parser
from image_preflight.errors import UsageError
from image_preflight.kube.client import ClusterFlags


def test_the_flags_map_onto_the_config(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "from-env")
    args = build_parser("agent")[0].parse_args(["agent", "--publish", "--kubeconfig", "kc", "--context", "c",
                                                "--pin-needed-images", "ns/needed"])
    config = AgentConfig.from_args(args)
    assert config.node == "from-env" and config.publish
    assert config.cluster == ClusterFlags(kubeconfig=args.kubeconfig, context="c")
    assert config.pin_needed_images == "ns/needed"


@pytest.mark.parametrize(("options", "message"), [
    ({"node": ""}, "--node: not given and NODE_NAME is not set"),
    ({"interval": 100.0}, "--interval 100: must be above 0 and below a third of --lease (100 s)"),
    ({"lease": 0}, "--lease 0: must be 1 to 3600"),
    ({"exit_after_failures": -1}, "--exit-after-failures -1: must be 0 or more"),
    ({"pin_needed_images": "needed"}, "--pin-needed-images: 'needed' is not NAMESPACE/NAME"),
    ({"publish": False, "pin_needed_images": "ns/needed"}, "--pin-needed-images: pins only with --publish"),
    ({"publish": False, "write_policy": "image-preflight-agent-own-node"},
     "--write-policy: checked only with --publish, which writes"),
])
def test_the_config_names_the_flag_it_refuses(options, message):
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        AgentConfig(**{"node": "n", "publish": True, **options})
