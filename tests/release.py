"""The release the tree is: its one version, pyproject.toml's, which the chart, the image's tag
and the docs repeat (tests/packaging/test_version.py holds them to it)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
IMAGE = f"image-preflight:{VERSION}"  # what the docs build and the chart runs
IMAGE_NAME = f"docker.io/library/{IMAGE}"  # what the runtime calls it (ParseDockerRef)
