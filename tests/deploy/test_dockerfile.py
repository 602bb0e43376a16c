"""The Dockerfile agrees with the Deployment the chart renders and with the package: a base pinned
by digest, the Pod's user, `serve` as its entrypoint, and a .dockerignore admitting every folder
the package installs from. Its build: tests/deploy/test_image_build.py."""

from __future__ import annotations

import re
import tomllib

from tests.deploy.rendered import _docs, _pod_spec
from tests.release import ROOT


def test_dockerfile_matches_the_deployment():
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    context = _pod_spec(_docs("default"))["containers"][0]["securityContext"]
    # The base users pull by default, by digest (tests/deploy/test_image_build.py); a build without
    # a registry names a local one.
    assert re.search(r"^ARG BASE=python:3\.11\.\d+-slim-bookworm@sha256:", dockerfile, re.M)
    assert re.search(r"^FROM \$\{BASE\}$", dockerfile, re.M)
    assert re.search(rf"^USER {context['runAsUser']}:{context['runAsGroup']}$", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["image-preflight", "serve"\]$', dockerfile, re.M)
    admitted = {line[1:].strip("/") for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
                if line.startswith("!")}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {setuptools.get("package-dir", {}).get(p, p.replace(".", "/")).split("/")[0]
               for p in setuptools["packages"]}
    assert folders | {"pyproject.toml", "README.md", "deploy/image/requirements.txt"} <= admitted
