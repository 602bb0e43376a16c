"""image-preflight: keep rollout Jobs off nodes that lack their locally built images.

The Python API (see image_preflight.api): load_inventory, decide, filter_rows, and the types they
return. Imported on first use, so that `image-preflight serve` does not load the scanner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "load_inventory": "image_preflight.api",
    "decide": "image_preflight.api",
    "filter_rows": "image_preflight.api",
    "Inventory": "image_preflight.core.inventory",
    "NodeImages": "image_preflight.core.inventory",
    "Decision": "image_preflight.core.decision",
    "ImageVerdict": "image_preflight.core.decision",
    "RowVerdict": "image_preflight.scanner.judge",
    "InputError": "image_preflight.errors",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from image_preflight.api import decide, filter_rows, load_inventory
    from image_preflight.core.decision import Decision, ImageVerdict
    from image_preflight.core.inventory import Inventory, NodeImages
    from image_preflight.errors import InputError
    from image_preflight.scanner.judge import RowVerdict


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'image_preflight' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
