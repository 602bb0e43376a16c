#!/usr/bin/env python3
"""mypy over the package as it is installed, with pyproject.toml's [tool.mypy] settings:

    .venv/bin/python .ci/typecheck.py [mypy's own arguments]

pyproject's package-dir installs each face folder (webhook/, scanner/, ...) inside the one import
package, as image_preflight.webhook and so on, and the editable install does the same with an import
hook. mypy finds modules by their folders and runs no import hook: from the checkout it would name
webhook/app.py `webhook.app`, and find no `image_preflight.webhook.app` where the code imports it.
So each file mypy is given is named here as it is imported, and mypy runs as its command does.
"""

from __future__ import annotations

import sys
import time
import tomllib
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]


def installed_name(source: BuildSource, faces: dict[str, str]) -> str:
    """`module` as the package's users import it: a face folder's modules live inside the package."""
    top, dot, rest = source.module.partition(".")
    package = faces.get(top)
    if package is None or source.path is None or not Path(source.path).resolve().is_relative_to(ROOT / top):
        return source.module
    return package + dot + rest


def main() -> int:
    start = time.time()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    faces = {folder: package for package, folder in setuptools["package-dir"].items()}
    fscache = FileSystemCache()
    found, options = process_options(sys.argv[1:], fscache=fscache)
    sources = [BuildSource(s.path, installed_name(s, faces), s.text, s.base_dir) for s in found]
    _, messages, blockers = run_build(sources, options, fscache, start, sys.stdout, sys.stderr)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    errors, notes, files = util.count_stats(messages)
    if errors:
        print(formatter.format_error(errors, files, len(sources), blockers=blockers, use_color=options.color_output))
        return 2 if blockers else 1
    print(formatter.format_success(len(sources), options.color_output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
