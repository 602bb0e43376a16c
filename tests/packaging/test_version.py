"""One version: pyproject.toml's. The CLI reads it from the installed metadata; the chart, the
image tag the docs build and load, and the tests (tests/release.py) repeat it, and are held to it
here, so a release changes it in pyproject.toml and the lines this test names."""

from __future__ import annotations

import re

import yaml

from tests.release import ROOT, VERSION

CHART = ROOT / "deploy" / "chart" / "image-preflight"
# Where a user reads or copies the version: the image's name and tag, the archive's and the
# chart package's names, the chart version `helm install` asks for.
PRINTED = re.compile(r"image[-_]preflight[:\-](\d+\.\d+\.\d+)\b|^\s*tag: (\d+\.\d+\.\d+)|--version (\d+\.\d+\.\d+)\b",
                     re.M)


def _printed() -> dict[str, set[str]]:
    places = [ROOT / "README.md", ROOT / "Dockerfile", *sorted((ROOT / "docs").glob("*.md")),
              CHART / "README.md", CHART / "Chart.yaml", *sorted((CHART / "ci").glob("*.yaml"))]
    found: dict[str, set[str]] = {}
    for path in places:
        for match in PRINTED.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(next(g for g in match.groups() if g), set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_chart_is_released_with_the_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["version"] == chart["appVersion"] == VERSION


def test_every_printed_version_is_the_packages():
    found = _printed()
    assert VERSION in found  # the pattern still finds what the docs print
    assert set(found) == {VERSION}, {version: sorted(paths) for version, paths in found.items() if version != VERSION}
