"""`image-preflight scan`: drop dataset rows whose rendered rollout Job names an image the nodes do
not hold. The rows are judged in image_preflight.core.rows; the Python API (image_preflight.api)
judges them the same way, and is reachable from here as well:

    from image_preflight.scanner import filter_rows
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=inventory)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["RowVerdict", "filter_rows", "judge_rows", "needed_images"]

if TYPE_CHECKING:
    from image_preflight.api import filter_rows, judge_rows, needed_images
    from image_preflight.core.rows.judge import RowVerdict


def __getattr__(name: str):
    # On first use: `scan`'s parser (scanner.config) is built without loading Jinja2.
    if name not in __all__:
        raise AttributeError(f"module 'image_preflight.scanner' has no attribute {name!r}")
    import image_preflight

    return getattr(image_preflight, name)
