"""Each long-running face takes SIGTERM and SIGINT before anything it starts answers: a kubelet, a
test or an operator may stop it the moment /metrics does, and it must still stop what it started
and exit 0 (the default handler would end it with -15 and lose the last log lines)."""

from __future__ import annotations

import importlib
import signal

import pytest

from image_preflight.cli import parse_config
from tests.builders.reviews import EXAMPLE_NODES
from tests.fake_apiserver import write_kubeconfig
from tests.serving import serve_args


class _Halt(Exception):
    """Ends the face where /metrics would start."""


@pytest.mark.parametrize("face", ["serve", "watchdog", "agent"])
def test_the_signal_handlers_are_in_place_before_metrics_answers(face, monkeypatch, webhook_certs, fake_apiserver,
                                                                  tmp_path):
    seen: list[object] = []

    def serve_metrics(*_args) -> None:
        seen.append(signal.getsignal(signal.SIGTERM))
        raise _Halt

    kubeconfig = str(write_kubeconfig(fake_apiserver, tmp_path / "kubeconfig"))
    config = {
        "serve": lambda: serve_args(webhook_certs, "--inventory", str(EXAMPLE_NODES)),
        "watchdog": lambda: parse_config(["watchdog", "--kubeconfig", kubeconfig]),
        "agent": lambda: parse_config(["agent", "--publish", "--node", "n", "--kubeconfig", kubeconfig,
                                       "--cri-endpoint", f"unix://{tmp_path}/no-runtime.sock"]),
    }[face]()
    module = importlib.import_module({"serve": "image_preflight.webhook.command",
                                      "watchdog": "image_preflight.watchdog.command",
                                      "agent": "image_preflight.agent.command"}[face])
    monkeypatch.setattr(module, "serve_metrics", serve_metrics)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(_Halt):
        module.run(config)
    assert seen and seen[0] not in (before, signal.SIG_DFL), seen
    assert signal.getsignal(signal.SIGTERM) is before
