"""What the tests do when a part they need is missing, and where measured figures go."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import pytest


def unavailable(reason: str) -> None:
    """Skip the test for `reason`; fail it instead when CI is set, where every part must be there."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}")
    pytest.skip(reason)


def record_figures(figures: Mapping[str, float]) -> None:
    """Append `figures` as one JSON line to $IMAGE_PREFLIGHT_FIGURES, when set (the benchmarks read it)."""
    if path := os.environ.get("IMAGE_PREFLIGHT_FIGURES"):
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(dict(figures)) + "\n")
