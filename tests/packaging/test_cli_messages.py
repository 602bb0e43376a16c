"""What the CLI says when the install is short of a module, and the cluster flags every command
that talks to the cluster offers alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from image_preflight.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "swe-smith"
# Each command that talks to the cluster, with the arguments it needs besides the cluster flags.
CLUSTER_COMMANDS = {
    "scan": ["scan", "train.jsonl", "--image", "x:1"],
    "serve": ["serve", "--tls-cert", "c", "--tls-key", "k"],
    "agent": ["agent", "--publish", "--node", "n"],
    "inventory": ["inventory", "dump"],
    "watchdog": ["watchdog"],
    "doctor": ["doctor"],
}


def test_a_missing_base_dependency_says_the_base_install_is_incomplete():
    """pyarrow is a dependency of the base install, not of an extra: say so, and name it."""
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from image_preflight.cli import main\n"
            f"raise SystemExit(main(['scan', {str(EXAMPLES / 'train.jsonl')!r}, '--image', '{{{{ input.image_name }}}}',"
            f" '--inventory', {str(EXAMPLES / 'nodes.json')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == ("image-preflight scan: the base install is incomplete (no module named 'pyarrow'): "
                    "pip install image-preflight")


@pytest.mark.parametrize("command", sorted(CLUSTER_COMMANDS))
def test_every_command_that_talks_to_the_cluster_takes_kubeconfig_and_context(command):
    args = build_parser()[0].parse_args([*CLUSTER_COMMANDS[command], "--kubeconfig", "kc", "--context", "other"])
    assert (args.kubeconfig, args.context) == (Path("kc"), "other")


def test_the_cluster_flags_are_worded_alike_everywhere():
    parser = build_parser()[0]
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    helps = set()
    for command in CLUSTER_COMMANDS:
        sub = subparsers[command]
        if command == "inventory":
            sub = next(a for a in sub._actions if a.dest == "action").choices["dump"]
        flags = {a.option_strings[0]: a.help for a in sub._actions
                 if a.option_strings and a.option_strings[0] in ("--kubeconfig", "--context")}
        assert set(flags) == {"--kubeconfig", "--context"}, command
        helps.add(tuple(text.split(": ", 1)[-1] if text.startswith(("without", "with")) else text
                        for text in flags.values()))
    assert len(helps) == 1, helps


@pytest.mark.parametrize("flags", [["--kubeconfig", "kc"], ["--context", "other"]])
def test_serve_watches_the_cluster_or_reads_a_snapshot_not_both(flags, capsys):
    code = main(["serve", "--tls-cert", "c", "--tls-key", "k", "--inventory", str(EXAMPLES / "nodes.json"), *flags])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("image-preflight serve: --kubeconfig and --context watch the cluster: "
                    "give them or --inventory, not both")
