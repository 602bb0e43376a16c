"""What every face's command shares: the flags more than one face offers, and `add_command`, how a
face's config becomes its subcommand (the frozen config is built first, so that a bad value is a
UsageError before anything heavy loads, then the command module, imported only to run)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES
from image_preflight.flags import COUNT, MAX_COUNT, PORT, Flags, Kind, add_flags, at_most, flag

LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level_flag() -> Any:
    return flag("info", choices=LOG_LEVELS, help="the least severe log records written")


def metrics_port_flag(default: int = 9090) -> Any:
    return flag(default, kind=PORT, help="plain-HTTP /metrics (0: off)")


# pkg/kubelet/apis/config/validation/validation.go, ValidateKubeletConfiguration: nodeStatusMaxImages
# "must be -1 or greater"; -1 lifts the cap. The field is an int32 (KubeletConfiguration).
MAX_IMAGES = Kind(COUNT.metavar, int,
                  lambda value: "must be -1 (no cap) or more" if value < -1 else at_most(MAX_COUNT)(value))


def max_images_flag(where: str = "") -> Any:
    return flag(DEFAULT_MAX_IMAGES, kind=MAX_IMAGES,
                help=f"the kubelets' nodeStatusMaxImages{where} (-1: no cap)")


def add_command(subparsers: Any, name: str, config: type[Flags], command: str,
                **parser: str | None) -> argparse.ArgumentParser:
    """Subcommand `name` with `config`'s flags, running `command`'s run(config) (`parser`: help,
    description, epilog)."""
    sub = subparsers.add_parser(name, **parser)
    add_flags(sub, config)

    def run(args: argparse.Namespace) -> int:
        built = config.from_args(args)
        return importlib.import_module(command).run(built)

    sub.set_defaults(run=run, config=config)
    return sub
