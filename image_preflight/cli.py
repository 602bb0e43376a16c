"""`image-preflight`: one command, a subcommand per face of the tool.

Each subcommand lives beside the library it drives (`scanner/command.py`, `certs/command.py`, ...)
and exposes `register(subparsers)`, which adds its parser and sets `run(args) -> int` as default.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from image_preflight.errors import UsageError

_COMMANDS = ("scanner.command", "webhook.command", "certs.command", "agent.command", "agent.dump_command")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="image-preflight",
        description="Keep rollout Jobs off nodes that lack their locally built images.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in _COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"image-preflight {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
