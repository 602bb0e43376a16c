"""`serve`'s flags as its frozen config holds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from image_preflight.cli import build_parser
from image_preflight.errors import UsageError
from image_preflight.kube.client import ClusterFlags
from image_preflight.webhook.config import ServeConfig


def test_the_flags_map_onto_the_config_and_the_admission_settings():
    args = build_parser("serve")[0].parse_args([
        "serve", "--tls-cert", "c", "--tls-key", "k", "--context", "other", "--steer", "--steer-max-nodes", "3",
        "--mode", "audit", "--unknown", "deny"])
    config = ServeConfig.from_args(args)
    assert config.cluster == ClusterFlags(context="other") and config.inventory is None
    settings = config.settings
    assert (settings.mode, settings.unknown, settings.steer, settings.max_steer_nodes) == ("audit", "deny", True, 3)


def test_the_config_names_the_flag_it_refuses():
    with pytest.raises(UsageError, match=r"^--steer-max-nodes 0: must be 1 or more$"):
        ServeConfig(tls_cert=Path("c"), tls_key=Path("k"), steer_max_nodes=0)
