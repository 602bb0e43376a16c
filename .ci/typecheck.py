#!/usr/bin/env python3
"""mypy over the package as it is installed, with pyproject.toml's [tool.mypy] settings:

    .venv/bin/python .ci/typecheck.py [mypy's own arguments]

pyproject's package-dir installs each face folder (webhook/, scanner/, ...) inside the one import
package, as image_preflight.webhook and so on, and the editable install does the same with an import
hook. mypy finds modules by their folders and runs no import hook: from the checkout it would name
webhook/app.py `webhook.app`, and find no `image_preflight.webhook.app` where the code imports it.
So mypy (its documented API, mypy.api) checks a tree of symbolic links laid out as the package is
installed, and the paths it reports are turned back into the checkout's.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[1]
# Kept between runs beside mypy's cache, so that the cache's paths stay the same.
TREE = ROOT / ".mypy_cache" / "installed"


def installed_tree(faces: dict[str, str]) -> Path:
    """TREE/image_preflight: the package's own entries, and each face folder under its name."""
    package = TREE / "image_preflight"
    shutil.rmtree(TREE, ignore_errors=True)
    package.mkdir(parents=True)
    for entry in (ROOT / "image_preflight").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder, name in faces.items():
        (package / name.removeprefix("image_preflight.")).symlink_to(ROOT / folder)
    return package


def main() -> int:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    faces = {folder: package for package, folder in setuptools["package-dir"].items() if package != "image_preflight"}
    package = installed_tree(faces)
    os.chdir(ROOT)  # mypy names files from here, as in the checkout
    tree = TREE.relative_to(ROOT)
    out, err, status = api.run(["--config-file", "pyproject.toml", "--cache-dir", ".mypy_cache", *sys.argv[1:],
                                str(package.relative_to(ROOT))])
    # TREE/image_preflight/webhook/app.py is webhook/app.py, TREE/image_preflight/x.py is image_preflight/x.py.
    for folder, name in faces.items():
        out = out.replace(f"{tree}/image_preflight/{name.removeprefix('image_preflight.')}/", f"{folder}/")
    out = out.replace(f"{tree}/", "")
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main())
