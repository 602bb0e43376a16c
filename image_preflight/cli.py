"""`image-preflight`: one command, a subcommand per face of the tool.

Each subcommand lives beside the library it drives (`scanner/command.py`, `certs/command.py`, ...)
and exposes `register(subparsers)`, which adds its parser and sets `run(args) -> int` as default.
Only the chosen subcommand's module is imported: `scan` need not load the webhook's server stack.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from image_preflight.errors import UsageError

COMMANDS = {
    "scan": "image_preflight.scanner.command",
    "serve": "image_preflight.webhook.command",
    "certs": "image_preflight.certs.command",
    "agent": "image_preflight.agent.command",
    "inventory": "image_preflight.agent.dump_command",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="image-preflight",
        description="Keep rollout Jobs off nodes that lack their locally built images.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not as a failure at interpreter exit
        return code
    except UsageError as exc:
        print(f"image-preflight {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`| head`); what was written to files stands. Exit 1, as rich's
        # console does when the same happens inside it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
