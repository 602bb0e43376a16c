"""The repository's Dockerfile built with no daemon and no network (tests/node/preflight_image.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.needs import record_figures, unavailable
from tests.node.preflight_image import INPUTS_ENV, BuiltImage, build_image, cleanup, missing


@pytest.fixture(scope="session")
def preflight_image(tmp_path_factory) -> Iterator[BuiltImage]:
    """The Dockerfile built once a session from $IMAGE_PREFLIGHT_IMAGE_INPUTS, with no network."""
    inputs = os.environ.get(INPUTS_ENV)
    if not inputs:
        unavailable(f"{INPUTS_ENV} is not set (run tests/node/image_inputs and export the folder it prints)")
    if (reason := missing()) is not None:
        unavailable(reason)
    workdir = tmp_path_factory.mktemp("preflight-image")
    try:
        image = build_image(Path(inputs), workdir)
        record_figures({"image_bud_s": image.build_seconds, "image_build_total_s": image.total_seconds,
                        "image_bytes": image.size_bytes, "image_archive_bytes": image.archive_bytes})
        yield image
    finally:
        cleanup(workdir)
