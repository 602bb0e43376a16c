"""Every command's help as a user reads it at 80 columns: every flag with its help and default, one
metavar for one kind of value, `--version`; and each flag defined once, on its config's field, so the
parser's defaults are the config's."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import image_preflight
from image_preflight.cli import COMMANDS, build_parser, main
from image_preflight.flags import Flags

ROOT = Path(__file__).resolve().parents[2]
COMMAND_LINES = [[name] for name in COMMANDS if name != "inventory"] + [["inventory", "dump"], ["inventory", "delete"]]
# The least each command needs besides its defaults, and the config that should come out.
MINIMAL = {
    "scan": (["d.jsonl", "--image", "x"], "image_preflight.scanner.config:ScanConfig",
             {"datasets": (Path("d.jsonl"),), "image": "x"}),
    "serve": (["--tls-cert", "c", "--tls-key", "k"], "image_preflight.webhook.config:ServeConfig",
              {"tls_cert": Path("c"), "tls_key": Path("k")}),
    "certs": (["--service", "s", "--namespace", "n", "--out-dir", "o"], "image_preflight.certs.config:CertsConfig",
              {"service": "s", "namespace": "n", "out_dir": Path("o")}),
    "agent": (["--print", "--node", "n"], "image_preflight.agent.config:AgentConfig",
              {"node": "n", "print_once": True}),
    "inventory dump": ([], "image_preflight.inventory.config:DumpConfig", {}),
    "inventory delete": ([], "image_preflight.inventory.config:DeleteConfig", {}),
    "watchdog": ([], "image_preflight.watchdog.config:WatchdogConfig", {}),
    "doctor": ([], "image_preflight.doctor.config:DoctorConfig", {}),
}


def _help(argv: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("AGL_NAMESPACE", "NODE_NAME")} | {"COLUMNS": "80"}
    done = subprocess.run([sys.executable, "-m", "image_preflight", *argv, "--help"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


def _options(text: str) -> dict[str, tuple[str, str]]:
    """{--flag: (metavar, help joined into one line)} from an argparse help text."""
    options, current = {}, None
    for line in text.split("\noptions:\n", 1)[1].splitlines():
        found = re.match(r"  (--[\w-]+)(?: (\S+))?(?:\s{2,}(.*))?$", line)
        if found:
            current = found.group(1)
            options[current] = (found.group(2) or "", found.group(3) or "")
        elif current and line.startswith(" " * 10):
            metavar, said = options[current]
            options[current] = (metavar, f"{said} {line.strip()}".strip())
        else:
            current = None
    return options


def _config(dotted: str) -> type:
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=" ".join)
def test_every_help_fits_80_columns_and_gives_every_flag_its_help_and_default(argv):
    text = _help(argv)
    assert all(len(line) <= 80 for line in text.splitlines()), [line for line in text.splitlines() if len(line) > 80]
    usage = " ".join(text.split("\n\n", 1)[0].split())
    for flag, (metavar, said) in _options(text).items():
        if flag == "--help":
            continue
        assert said, f"{flag} has no help"
        required = re.search(rf"(?<!\[){flag}\b", usage) or re.search(rf"\({flag}\b|\| {flag}\b", usage)
        if metavar and not required:
            assert "(default: " in said, f"{' '.join(argv)} {flag}: no default in {said!r}"
        # A default or a value is never broken across lines at a hyphen.
        assert not re.search(r"\w- \w", said), said


def test_one_kind_of_value_has_one_metavar_in_every_command():
    seen: dict[str, set[str]] = {}
    for argv in COMMAND_LINES:
        for flag, (metavar, _) in _options(_help(argv)).items():
            if metavar and not metavar.startswith("{"):
                seen.setdefault(flag, set()).add(metavar)
    assert {flag: metavars for flag, metavars in seen.items() if len(metavars) > 1} == {}
    kinds = set().union(*seen.values())
    assert kinds <= {"FILE", "DIR", "SECONDS", "N", "PORT", "NAME", "NAMESPACE", "ADDRESS", "SELECTOR", "KEY=VALUE",
                     "IMAGE", "EXPR", "ENDPOINT", "NAMESPACE/NAME", "QUANTITY", "HOST:PORT", "DAYS"}, kinds
    assert seen["--metrics-port"] == {"PORT"} and seen["--out-dir"] == {"DIR"} and seen["--inventory"] == {"FILE"}


@pytest.mark.parametrize("command", sorted(MINIMAL))
def test_the_parsers_defaults_are_the_configs(command, monkeypatch):
    """Each flag is defined once: parsing nothing but the required flags gives the config's defaults."""
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("AGL_NAMESPACE", raising=False)
    argv, dotted, required = MINIMAL[command]
    config = _config(dotted)
    assert issubclass(config, Flags)
    parsed = build_parser(command.split()[0])[0].parse_args([*command.split(), *argv])
    assert config.from_args(parsed) == config(**required)


def test_flags_come_from_the_environment_where_their_help_says_so(monkeypatch):
    monkeypatch.setenv("AGL_NAMESPACE", "rollouts")
    monkeypatch.setenv("NODE_NAME", "cpu-1")
    doctor = _config(MINIMAL["doctor"][1]).from_args(build_parser("doctor")[0].parse_args(["doctor"]))
    agent = _config(MINIMAL["agent"][1]).from_args(build_parser("agent")[0].parse_args(["agent", "--print"]))
    assert (doctor.namespace, agent.node) == ("rollouts", "cpu-1")


def test_version_is_the_installed_distributions(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"image-preflight {importlib.metadata.version('image-preflight')}\n"


def test_a_usage_error_is_one_line_naming_the_flag(capsys):
    assert main(["scan", "d.jsonl", "--image", "x", "--max-images", "many"]) == 2
    assert capsys.readouterr().err == ("image-preflight scan: argument --max-images: invalid int value: 'many' "
                                       "(see image-preflight scan --help)\n")


def test_inventory_dump_names_itself_in_its_errors(tmp_path, capsys):
    assert main(["inventory", "dump", "--kubeconfig", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err == (f"image-preflight inventory dump: {tmp_path / 'absent'}: cannot read the "
                                       "kubeconfig (No such file or directory)\n")


def test_the_api_shows_its_defaults_as_a_caller_writes_them():
    for function in (image_preflight.judge_rows, image_preflight.filter_rows, image_preflight.needed_images,
                     image_preflight.decide):
        assert "require: 'str' = 'all'" in str(inspect.signature(function)), function


def test_serve_turns_unready_only_after_a_watch_may_rightly_be_silent():
    """webhook/config.py MAX_INVENTORY_AGE_S above kube/watch.py's longest tolerated silence."""
    from image_preflight.kube.watch import SILENCE_TIMEOUT_S, ResourceWatcher
    from image_preflight.webhook.config import ServeConfig

    timeout = inspect.signature(ResourceWatcher).parameters["watch_timeout_seconds"].default
    default = next(f.default for f in dataclasses.fields(ServeConfig) if f.name == "max_inventory_age")
    assert timeout + SILENCE_TIMEOUT_S < default


def test_docs_agent_md_lists_exactly_the_agents_flags():
    text = (ROOT / "docs" / "agent.md").read_text(encoding="utf-8")
    documented = re.findall(r"^\| `(--[\w-]+)` \|", text, re.M)
    assert sorted(documented) == sorted(set(_options(_help(["agent"]))) - {"--help"})
