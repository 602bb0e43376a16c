"""`image-preflight`: one command, a subcommand per face of the tool.

Each subcommand lives beside the library it drives (`scanner/command.py`, `certs/command.py`, ...)
and exposes `register(subparsers)`, which adds its parser and sets `run(args) -> int` as default.
Only the chosen subcommand's module is imported: `scan` need not load the webhook's server stack.
A subcommand whose dependencies are not installed is still listed, and says which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import NamedTuple

from image_preflight.errors import InputError, UsageError


class Command(NamedTuple):
    module: str
    extra: str  # the distribution's extra that installs its dependencies ("" for the base install)
    summary: str


COMMANDS = {
    "scan": Command("image_preflight.scanner.command", "", "drop dataset rows whose images the nodes do not hold"),
    "serve": Command("image_preflight.webhook.command", "webhook", "run the validating admission webhook"),
    "certs": Command("image_preflight.certs.command", "webhook", "create or renew the webhook's CA and certificate"),
    "agent": Command("image_preflight.agent.command", "agent", "publish this node's complete image list"),
    "inventory": Command("image_preflight.agent.dump_command", "kube", "write the cluster's nodes and images"),
    "watchdog": Command("image_preflight.watchdog.command", "watchdog", "fail a Job whose Pod cannot get its node-local image"),
    "doctor": Command("image_preflight.doctor.command", "kube", "check the cluster end to end, each finding with its fix"),
}


def add_cluster_arguments(parser: argparse.ArgumentParser, when: str = "") -> None:
    """--kubeconfig and --context, worded alike for every subcommand that reads the cluster
    (image_preflight.kube.client.api_client chooses as kubectl does). `when` prefixes the help."""
    parser.add_argument("--kubeconfig", type=Path, metavar="FILE",
                        help=f"{when}as kubectl's (default: in a pod its service account, else $KUBECONFIG or "
                        "~/.kube/config)")
    parser.add_argument("--context", metavar="NAME", help=f"{when}a context of the kubeconfig (default: its current one)")


def _problem(command: Command, exc: ImportError) -> str:
    missing = exc.name or str(exc)
    if missing.startswith("image_preflight"):
        return f"cannot load {missing} ({exc}): the installation is incomplete; reinstall image-preflight"
    extra = command.extra or "all"
    return f"needs the '{extra}' extra (no module named {missing!r}): pip install 'image-preflight[{extra}]'"


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The parser, and for each subcommand that cannot be loaded, why (it is still listed)."""
    parser = argparse.ArgumentParser(
        prog="image-preflight",
        description="Keep rollout Jobs off nodes that lack their locally built images.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    unavailable: dict[str, str] = {}
    for name, command in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(command.module)
        except ImportError as exc:
            unavailable[name] = _problem(command, exc)
            subparsers.add_parser(name, help=f"{command.summary} (unavailable: {unavailable[name].split(':')[0]})")
            continue
        module.register(subparsers)
    return parser, unavailable


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    parser, unavailable = build_parser(chosen if chosen in COMMANDS else None)
    if chosen in unavailable:
        print(f"image-preflight {chosen}: {unavailable[chosen]}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):
        # Row and image texts may hold what the terminal cannot encode (a lone surrogate from a
        # JSON escape, non-ASCII under an ASCII locale): printed as escapes, never a traceback.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    try:
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not as a failure at interpreter exit
        return code
    except (UsageError, InputError) as exc:
        print(f"image-preflight {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`| head`); what was written to files stands. Exit 1, as rich's
        # console does when the same happens inside it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
