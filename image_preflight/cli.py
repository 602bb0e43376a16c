"""`image-preflight`: one command, a subcommand per face of the tool.

Each subcommand's flags live beside the library it drives, in `<face>/config.py`: `register(subparsers)`
adds its parser, whose `run(args)` maps the flags onto a frozen config and hands it to the runner in
`<face>/command.py` (inventory's two actions: dump.py, delete.py). A config module imports no heavy
library, so building a parser costs little; only the chosen subcommand's is imported, and its runner
(with the face's libraries) only when it runs. A subcommand whose extra is not installed is still
listed, answers --help, and says which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from typing import NamedTuple

from image_preflight.errors import PreflightError
from image_preflight.faces import BASE_MODULES, EXTRA_MODULES


class Command(NamedTuple):
    module: str  # its flags and config; imports its runner when run
    extra: str  # the distribution's extra that installs its dependencies ("" for the base install)
    summary: str

    @property
    def needs(self) -> tuple[str, ...]:
        """The modules its extra installs, looked up (not imported) before it runs."""
        return EXTRA_MODULES[self.extra] if self.extra else ()


COMMANDS = {
    "scan": Command("image_preflight.scanner.config", "", "drop dataset rows whose images the nodes do not hold"),
    "serve": Command("image_preflight.webhook.config", "webhook", "run the validating admission webhook"),
    "certs": Command("image_preflight.certs.config", "webhook", "create or renew the webhook's CA and certificate"),
    "agent": Command("image_preflight.agent.config", "agent", "publish this node's complete image list"),
    "inventory": Command("image_preflight.inventory.config", "kube", "write the cluster's nodes and images"),
    "watchdog": Command("image_preflight.watchdog.config", "watchdog",
                        "fail a Job whose Pod cannot get its node-local image"),
    "doctor": Command("image_preflight.doctor.config", "kube",
                      "check the cluster end to end, each finding with its fix"),
}


def _missing(command: Command) -> str | None:
    """The first module of the command's extra that is not installed, if any."""
    for name in command.needs:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:  # a dotted name whose parent is absent
            return name
    return None


def _problem(command: Command, missing: str, detail: str = "") -> str:
    if missing.startswith("image_preflight"):
        return f"cannot load {missing} ({detail}): the installation is incomplete; reinstall image-preflight"
    if not command.extra or missing.partition(".")[0] in BASE_MODULES:
        return f"the base install is incomplete (no module named {missing!r}): pip install image-preflight"
    extra = command.extra
    return f"needs the '{extra}' extra (no module named {missing!r}): pip install 'image-preflight[{extra}]'"


def version() -> str:
    try:
        return importlib.metadata.version("image-preflight")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class Parser(argparse.ArgumentParser):
    """argparse's parser, saying a usage error in one line, as every other error is said."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The parser, and for each subcommand that cannot run, why. Every subcommand is listed and
    answers --help: its flags cost no import of its extra's libraries."""
    parser = Parser(
        prog="image-preflight",
        description="Keep rollout Jobs off nodes that lack their locally built images.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    unavailable: dict[str, str] = {}
    for name, command in COMMANDS.items():
        if only is not None and name != only:
            continue
        missing = _missing(command)
        if missing is not None:
            unavailable[name] = _problem(command, missing)
        try:
            module = importlib.import_module(command.module)
        except ImportError as exc:
            unavailable[name] = _problem(command, exc.name or str(exc), str(exc))
            subparsers.add_parser(name, help=f"{command.summary} (unavailable: {unavailable[name].split(':')[0]})")
            continue
        module.register(subparsers, epilog=_needs(command, unavailable.get(name)))
    return parser, unavailable


def _needs(command: Command, problem: str | None) -> str | None:
    """What the command's help says about its extra: what to install, and whether it is here."""
    if problem is not None:
        return f"Not runnable here: this command {problem}."
    if command.extra:
        return f"Needs the '{command.extra}' extra: pip install 'image-preflight[{command.extra}]'."
    return None


def parse_config(argv: list[str]):
    """The config a command line builds (its frozen Flags), without running it."""
    args = build_parser(next((arg for arg in argv if not arg.startswith("-")), None))[0].parse_args(argv)
    return args.config.from_args(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    parser, unavailable = build_parser(chosen if chosen in COMMANDS else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already said
        return exc.code if isinstance(exc.code, int) else 2
    if args.command in unavailable:
        print(f"image-preflight {args.command}: {unavailable[args.command]}", file=sys.stderr)
        return 2
    label = " ".join(filter(None, ("image-preflight", args.command, getattr(args, "action", None))))
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
    except PreflightError as exc:
        print(f"{label}: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        # The runner imports its libraries when it runs: one absent is named with what installs it.
        print(f"{label}: {_problem(COMMANDS[args.command], exc.name or str(exc), str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`| head`); what was written to files stands. Exit 1, as rich's
        # console does when the same happens inside it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
