"""image-preflight: keep rollout Jobs off nodes that lack their locally built images.

The Python API (see image_preflight.api): load_inventory, decide, filter_rows, and the types they
return. Each is imported on first use, so that a command loads only what it runs (`image-preflight
serve` never loads Jinja2, which renders the rows' Jobs).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from image_preflight.faces import FACES as _FACES

_HERE = Path(__file__).resolve().parent


class _FacesBeside(importlib.abc.MetaPathFinder):
    """Imported from a source checkout (the current folder on sys.path, say) the faces sit beside
    this folder; installed, pyproject's package-dir puts them inside it. setuptools' editable
    finder covers editable installs only, so a checkout next to a normal install needs this."""

    def find_spec(self, fullname, path, target=None):
        prefix, _, face = fullname.partition(".")
        if prefix != __name__ or face not in _FACES:
            return None
        init = _HERE.parent / face / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


if not (_HERE / "scanner").is_dir() and (_HERE.parent / "pyproject.toml").is_file():
    sys.meta_path.append(_FacesBeside())

_EXPORTS = {
    "load_inventory": "image_preflight.api",
    "decide": "image_preflight.api",
    "filter_rows": "image_preflight.api",
    "needed_images": "image_preflight.api",
    "judge_rows": "image_preflight.api",
    "Inventory": "image_preflight.core.decide.inventory",
    "NodeImages": "image_preflight.core.decide.inventory",
    "Decision": "image_preflight.core.decide.decision",
    "ImageVerdict": "image_preflight.core.decide.decision",
    "RowVerdict": "image_preflight.core.rows.judge",
    "InputError": "image_preflight.errors",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what type checkers see of _EXPORTS: each name re-exported as itself
    from image_preflight.api import decide as decide
    from image_preflight.api import filter_rows as filter_rows
    from image_preflight.api import judge_rows as judge_rows
    from image_preflight.api import load_inventory as load_inventory
    from image_preflight.api import needed_images as needed_images
    from image_preflight.core.decide.decision import Decision as Decision
    from image_preflight.core.decide.decision import ImageVerdict as ImageVerdict
    from image_preflight.core.decide.inventory import Inventory as Inventory
    from image_preflight.core.decide.inventory import NodeImages as NodeImages
    from image_preflight.core.rows.judge import RowVerdict as RowVerdict
    from image_preflight.errors import InputError as InputError


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'image_preflight' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
