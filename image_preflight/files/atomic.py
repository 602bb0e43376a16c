"""Writing a file in one step: readers see the old file or the new one, never a part.

The one atomic-write helper of the project (the scanner's outputs, the report, `inventory dump`,
certificates and manifests). A new file gets the mode an ordinary open() would give it (the umask
decides), unless the caller asks for one (private keys).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from image_preflight.errors import InputError


def umask_mode() -> int:
    """0o666 less the process umask: what open(path, "w") creates."""
    # Reading the umask means setting it; /proc says it without that race where the kernel can.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_path(path: Path, mode: int | None = None) -> Iterator[str]:
    """A temporary path beside `path` that replaces it once the block ends without an error (and
    is removed when it raises). InputError names `path` when it cannot be written."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.",
                                   suffix=".tmp")
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({_why(exc)})") from None
    try:
        try:
            os.fchmod(fd, umask_mode() if mode is None else mode)
        finally:
            os.close(fd)
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise InputError(f"{path}: cannot write ({_why(exc)})") from None
        raise


def write_atomic(path: Path, data: bytes | str, mode: int | None = None) -> None:
    """Replace `path` with `data` (str is written as UTF-8) in one step."""
    with atomic_path(path, mode) as tmp:
        Path(tmp).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def write_all_atomic(files: Sequence[tuple[Path, bytes, int | None]]) -> None:
    """Replace every (path, data, mode) in the order given, none until all are written beside
    their targets: one that cannot be written leaves every file as it was."""
    with ExitStack() as staged:
        for path, data, mode in reversed(files):  # the last staged is the first replaced
            with open(staged.enter_context(atomic_path(path, mode)), "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())  # a full disk shows here, before the first file is replaced


def _why(exc: OSError) -> str:
    return " ".join((exc.strerror or str(exc)).split())
