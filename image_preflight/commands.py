"""What every face's command shares: the flags more than one face offers, and `runner`, how a
parser hands its flags to its command (the frozen config first, so that a bad value is a
UsageError before anything heavy loads, then the command module, imported only to run)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Protocol

LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"
DEFAULT_METRICS_PORT = 9090


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default=DEFAULT_LOG_LEVEL, choices=LOG_LEVELS, help="default %(default)s")


def add_metrics_port_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                        help="plain-HTTP /metrics (0: off; default %(default)s)")


class Config(Protocol):
    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Config: ...


def runner(config: type[Config], command: str) -> Callable[[argparse.Namespace], int]:
    """The `run` a subparser sets: `command`'s run(config.from_args(args))."""

    def run(args: argparse.Namespace) -> int:
        built = config.from_args(args)
        return importlib.import_module(command).run(built)

    return run
