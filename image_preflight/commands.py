"""How a face's parser hands its flags to its command: the frozen config first, so a bad value is
a UsageError before anything heavy loads, then the command module, imported only to run."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Protocol


class Config(Protocol):
    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Config: ...


def runner(config: type[Config], command: str) -> Callable[[argparse.Namespace], int]:
    """The `run` a subparser sets: `command`'s run(config.from_args(args))."""

    def run(args: argparse.Namespace) -> int:
        built = config.from_args(args)
        return importlib.import_module(command).run(built)

    return run
