"""Images for the real node, built here from Debian's static busybox and never pushed anywhere.

One layer serves every image: busybox with the applets a rollout's command line uses, a `bash`
that runs busybox's sh (agent-lightning's SWE-smith template runs `bash -lc`), and a `python` that only
reports its arguments and exits 0, standing in for the agent script a SWE-smith image runs. The
pause image is the same layer with a process that sleeps until it is killed.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

from tests.containerd import build_oci_archive_many

BUSYBOX = "/bin/busybox"  # Debian's busybox-static
APPLETS = ("sh", "sleep", "mkdir", "tee", "true", "false", "echo", "cat", "ls", "env")
PYTHON = b'#!/bin/sh\necho "rollout: python $*"\n'
BASH = b'#!/bin/sh\nexec /bin/sh "$@"\n'  # busybox has no bash applet; its ash takes -lc alike
PAUSE_NAME = "registry.k8s.io/pause:3.10.1"  # named as the runtime's default; imported, never pulled
PAUSE_RUN = ("/bin/sleep", "2147483647")


def swe_smith_image(owner: str, repo: str, commit: str) -> str:
    """A rollout image as `pull_images.py` + import leave it on a node: the SWE-smith image's
    name, tagged `:openai`, fully qualified as CRI names it."""
    return f"docker.io/jyangballin/swesmith.x86_64.{owner}_1776_{repo}.{commit[:8]}:openai"


def busybox_missing() -> str | None:
    """Why the images cannot be built here, or None."""
    if not os.access(BUSYBOX, os.X_OK):
        return f"{BUSYBOX} missing (apt-get install busybox-static)"
    return None


def _entry(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, mode: int = 0o755,
           link: str | None = None, directory: bool = False) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0  # fixed, so the layer's digest depends on busybox alone
    info.mode = mode
    if directory:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif link is not None:
        info.type = tarfile.SYMTYPE
        info.linkname = link
        tar.addfile(info)
    else:
        assert data is not None
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def busybox_layer() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("bin", "usr", "usr/bin", "tmp", "etc"):
            _entry(tar, folder, directory=True, mode=0o1777 if folder == "tmp" else 0o755)
        _entry(tar, "bin/busybox", data=Path(BUSYBOX).read_bytes())
        for applet in APPLETS:
            _entry(tar, f"bin/{applet}", link="busybox")
        _entry(tar, "usr/bin/python", data=PYTHON)
        _entry(tar, "bin/bash", data=BASH)
        _entry(tar, "etc/passwd", data=b"root:x:0:0:root:/:/bin/sh\n", mode=0o644)
    return buf.getvalue()


def write_images(path: Path, names: Sequence[str], *, pause: bool = False) -> list[str]:
    """One OCI archive holding an image per name (the pause process when `pause`); their ids."""
    return build_oci_archive_many(path, names, layer=busybox_layer(), run=PAUSE_RUN if pause else ())
