"""What the CLI says when the install is short of a module, or when a long-running face's loop
breaks; and the cluster flags every command that talks to the cluster offers alike."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

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
            f"raise SystemExit(main(['scan', {str(EXAMPLES / 'train.jsonl')!r}, "
            f"'--image', '{{{{ input.image_name }}}}',"
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


# Each command with the arguments it needs, for the flags of numbers below.
RUNNABLE = {
    "scan": ["scan", "train.jsonl", "--image", "x:1"],
    "serve": ["serve", "--tls-cert", "c", "--tls-key", "k"],
    "certs": ["certs", "--service", "s", "--namespace", "n", "--out-dir", "out"],
    "agent": ["agent", "--publish", "--node", "n"],
    "inventory dump": ["inventory", "dump"],
    "inventory delete": ["inventory", "delete"],
    "watchdog": ["watchdog"],
    "doctor": ["doctor"],
}


def _number_flags() -> list[tuple[str, str]]:
    """(command, flag) for every flag whose value is a number, found on the configs' fields."""
    found = []
    for command, argv in RUNNABLE.items():
        config = build_parser(argv[0])[0].parse_args(argv).config
        fields = list(dataclasses.fields(config))
        while fields:
            field = fields.pop()
            if "group" in field.metadata:
                fields += dataclasses.fields(field.metadata["group"])
                continue
            spec = field.metadata.get("flag")
            if spec is not None and spec.kind is not None:
                try:
                    number = spec.kind.parse("1")
                except (ValueError, TypeError):  # argparse.ArgumentTypeError is neither
                    continue
                except argparse.ArgumentTypeError:
                    continue
                if isinstance(number, (int, float)):
                    found.append((command, spec.name or "--" + field.name.replace("_", "-")))
    return sorted(found)


def test_the_flags_of_numbers_are_found():
    flags = _number_flags()
    assert {("certs", "--days"), ("agent", "--pin-max-bytes"), ("serve", "--max-inventory-age"),
            ("scan", "--max-images"), ("inventory delete", "--settle")} <= set(flags)


@pytest.mark.parametrize("command, flag", _number_flags())
def test_every_number_a_flag_takes_is_bounded_and_a_value_past_it_refused_in_one_line(command, flag, capsys,
                                                                                    tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*RUNNABLE[command], flag, "1" + "0" * 30]) == 2  # past an int64, a year of seconds, any port
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"image-preflight {command}: {flag} ") and ": must be " in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag, value, said", [
    ("--max-inventory-age", "0", "--max-inventory-age 0: must be above 0"),  # the field's check, then its kind's
    ("--max-inventory-age", "1e9", "--max-inventory-age 1e+09: must be 31536000 (a year) or less"),
    ("--steer-max-nodes", "0", "--steer-max-nodes 0: must be 1 or more"),
    ("--steer-max-nodes", "2147483648", "--steer-max-nodes 2147483648: must be 2147483647 or less"),
    ("--max-images", "2147483648", "--max-images 2147483648: must be 2147483647 or less"),
])
def test_a_fields_own_check_narrows_its_kinds_bounds(flag, value, said, capsys):
    assert main([*RUNNABLE["serve"], flag, value]) == 2
    assert capsys.readouterr().err == f"image-preflight serve: {said}\n"


@pytest.fixture
def no_kubeconfig(tmp_path, monkeypatch):
    """A user with no kubeconfig, outside a cluster: HOME is an empty folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def test_without_a_kubeconfig_the_scan_names_the_file_it_looked_for_and_suggests_a_snapshot(no_kubeconfig, capsys):
    assert main(["scan", str(EXAMPLES / "train.jsonl"), "--image", "{{ input.image_name }}:openai"]) == 2
    assert capsys.readouterr().err == (
        f"image-preflight scan: {no_kubeconfig / '.kube' / 'config'}: no such file (the default kubeconfig, "
        "$KUBECONFIG unset): no configuration has been provided; give --kubeconfig FILE, or scan against a "
        "snapshot with --inventory FILE\n")


def test_without_the_files_kubeconfig_lists_a_command_names_them_all(no_kubeconfig, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", f"{no_kubeconfig / 'a'}:{no_kubeconfig / 'b'}")
    assert main(["inventory", "dump"]) == 2
    assert capsys.readouterr().err == (
        f"image-preflight inventory dump: {no_kubeconfig / 'a'}, {no_kubeconfig / 'b'}: no such file ($KUBECONFIG): "
        "no configuration has been provided; give --kubeconfig FILE\n")


class _BreakingLoop:
    """A face's loop (the agent's, the watchdog's) that ends on an exception it does not handle."""

    publisher = SimpleNamespace(where="nodeimages/n")  # what the agent logs as it starts

    def run(self, stop: threading.Event) -> bool:
        raise RuntimeError("lost its way")

    def wake(self) -> None:
        pass


class _Runtime:
    """The agent's CRI client, never dialled."""

    endpoint = "unix:///run/nothing.sock"

    def __init__(self, endpoint: str) -> None:
        pass

    def __enter__(self) -> "_Runtime":
        return self

    def __exit__(self, *_) -> None:
        pass


@pytest.mark.parametrize("face", ["agent", "watchdog"])
def test_every_face_whose_loop_breaks_says_so_in_one_line_and_exits_2(face, monkeypatch, capsys):
    from image_preflight.agent import command as agent
    from image_preflight.watchdog import command as watchdog

    for module in (agent, watchdog):
        monkeypatch.setattr(module, "configure_logging", lambda level: None)  # the test's own log capture stays
    monkeypatch.setattr(agent, "ImageClient", _Runtime)
    monkeypatch.setattr(agent, "_start", lambda images, config, stops: _BreakingLoop())
    monkeypatch.setattr(watchdog, "start", lambda config, stops: _BreakingLoop())
    argv = {"agent": ["agent", "--publish", "--node", "n"], "watchdog": ["watchdog"]}[face]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"image-preflight {face}: the {face} loop ended unexpectedly (RuntimeError: lost its way; its traceback is "
        "logged)")
